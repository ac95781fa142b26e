-- Causal sliding-window attention (Mistral, Gemma local layers): query q sees
-- keys q - window + 1 .. q. The window is a runtime parameter, supplied at
-- launch (--param window=4096), so changing it does not recompile.
local window = param("window", "i32")

return {
  name = "sliding_window",
  mask_mod = sliding_window(window),
}
