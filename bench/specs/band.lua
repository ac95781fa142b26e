-- A block-aligned band (a diagnostic for bench/ablate.sh): query block qb
-- sees kv blocks qb - blocks .. qb of 128 positions, so that every 128 x 128
-- tile is FULL or EMPTY and no mask is evaluated. Beside the sliding window
-- of the same width it shows what the window's two masked tiles a row cost.
local blocks = param("blocks", "i32")

return {
  name = "band",
  mask_mod = function(b, h, q, kv)
    local qb = q // 128
    local kb = kv // 128
    return le(kb, qb) & le(qb - kb, blocks)
  end,
}
