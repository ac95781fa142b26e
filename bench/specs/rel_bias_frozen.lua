-- rel_bias.lua without the table's gradient (a frozen bias): the same
-- score_mod and mask, so that the cost of the bias gradient shows as the
-- ratio of the two (bench/compare.py --backward prints it).
local bias = buffer("bias", "f32")

return {
  name = "rel_bias_frozen",
  mask_mod = causal(),
  score_mod = function(score, b, h, q, kv)
    return score + bias[h * 64 + min(max(q - kv, 0), 63)]
  end,
}
