-- ALiBi (Press et al.): a causal mask plus a linear bias on the distance,
-- slope 2^(-8 (h + 1) / Hq) for head h, computed in the kernel from the head
-- count of the launch.
return {
  name = "alibi_causal",
  mask_mod = causal(),
  score_mod = alibi(),
}
