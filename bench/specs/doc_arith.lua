-- The causal document mask of three documents whose ids come from two
-- boundaries (params `first` and `second`: the first positions of the second
-- and third documents) instead of a buffer (a diagnostic for bench/ab_builds.sh).
-- The kernel then classifies its tiles from indices (no block mask) and a
-- masked tile computes the ids without loads: beside examples/document.lua
-- with the same documents, it shows what the ids' loads and the block mask
-- cost.
local first = param("first", "i32")
local second = param("second", "i32")

local function doc(x)
  return where(ge(x, first), 1, 0) + where(ge(x, second), 1, 0)
end

return {
  name = "doc_arith",
  mask_mod = function(b, h, q, kv)
    return le(kv, q) & eq(doc(q), doc(kv))
  end,
}
