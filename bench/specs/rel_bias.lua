-- A learned relative-position bias, trained: each head h has 64 f32 values,
-- one per clamped distance q - kv (0 .. 63; farther keys share the last),
-- causal. The backward pass computes the table's gradient (grad = true).
-- bench/compare.py --backward times it beside rel_bias_frozen.lua, the same
-- spec without that gradient, and beside FlexAttention with the same
-- score_mod. The table is --buffer bias=FILE.npy (H x 64 float32).
local bias = buffer("bias", "f32", {grad = true})

return {
  name = "rel_bias",
  mask_mod = causal(),
  score_mod = function(score, b, h, q, kv)
    return score + bias[h * 64 + min(max(q - kv, 0), 63)]
  end,
}
