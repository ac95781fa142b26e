-- Plain (non-causal) attention: every query sees every key. A spec needs a
-- mask_mod or a score_mod; the identity score_mod says "no change".
return {
  name = "full",
  score_mod = noop_score(),
}
