-- T5-style bucketed relative position bias, for a causal decoder.
--
-- The distance n = q - kv (0 for the future, which the mask removes anyway)
-- falls into one of `num_buckets` buckets: one bucket per distance below
-- `exact`, then buckets whose width grows logarithmically up to
-- `max_distance`; farther keys share the last bucket. Each head has its own
-- learned bias per bucket: rel_bias[h * num_buckets + bucket], f32.
--
-- The thresholds are computed here, in plain Lua, when the spec loads: they
-- are compile-time constants of the kernel. Inside the mod only traced
-- arithmetic happens: the bucket is min(n, exact) plus the number of
-- thresholds n has reached, so no float-to-int conversion is needed.
local num_buckets = 32
local max_distance = 128
local exact = num_buckets // 2
local bias = buffer("rel_bias", "f32")

-- n >= thresholds[k] puts n at least k buckets past `exact`.
local thresholds = {}
for k = 1, num_buckets - exact - 1 do
  local t = exact * (max_distance / exact) ^ (k / (num_buckets - exact))
  thresholds[k] = math.ceil(t)
end

local function bucket(n)
  local index = min(n, exact)
  for k = 1, #thresholds do
    index = index + where(ge(n, thresholds[k]), 1, 0)
  end
  return index
end

return {
  name = "t5_relative_buckets",
  mask_mod = causal(),
  score_mod = function(score, b, h, q, kv)
    local n = max(q - kv, 0)
    return score + bias[h * num_buckets + bucket(n)]
  end,
}
