-- Logit soft-capping (Gemma 2 style): scores are squashed into (-cap, cap) with
-- cap * tanh(score / cap) before the softmax; causal. cap = 30 matches the
-- benchmark anchors.
return {
  name = "softcap_causal",
  mask_mod = causal(),
  score_mod = softcap(30.0),
}
