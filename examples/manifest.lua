-- examples/manifest.lua: what `flexjit precompile` builds for a deployment.
--
--   flexjit precompile examples/manifest.lua --out kernels.fjpack -j 2
--   flexjit precompile examples/manifest.lua --out /opt/app/flexjit-cache
--
-- Every combination of the lists below becomes one kernel (here 3 specs x
-- 2 head dims x 2 dtypes x 2 targets x 3 passes = 72 jobs; forward_blockmask
-- differs from forward only at head dim 64 on sm_90a, and the block-mask
-- builder is one per spec and target, so 36 distinct kernels). Spec paths
-- are relative
-- to this file. The manifest runs in the same sandbox as specs, so it may
-- compute its lists, but it cannot read files or the environment.
return {
  specs = {
    "causal.lua",
    "sliding_window.lua",
    "document.lua",
  },
  head_dims = {64, 128},
  dtypes = {"bf16", "fp16"},
  -- Exact targets: a cubin runs only on its major architecture, and sm_90a
  -- (Hopper with wgmma/TMA) is not sm_90.
  archs = {"sm_80", "sm_90a"},
  -- forward_blockmask: the kernel launches with a 128 x 128 block mask take
  -- (document.lua's, which `flexjit run` builds); the same kernel as forward
  -- except at head dim 64 on sm_90a. blockmask: the kernels that build a
  -- spec's block masks (one per spec and target).
  passes = {"forward", "forward_blockmask", "blockmask"},
}
