-- Causal (autoregressive) attention: query q sees keys 0..q.
return {
  name = "causal",
  mask_mod = causal(),
}
