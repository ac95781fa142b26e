-- Prefix LM (T5/UL2-style): the first `prefix` positions attend to each other
-- bidirectionally; the rest of the sequence is causal.
local prefix = param("prefix", "i32")

return {
  name = "prefix_lm",
  mask_mod = prefix_lm(prefix),
}
