-- flexjit prelude: the standard masks and score mods, written in plain Lua on
-- top of the DSL (lt le gt ge eq ne where, & | ~, the math functions, param,
-- buffer and the size symbols B Hq Hkv Lq Lk).
--
-- Each builder runs once, when the spec's chunk calls it, and returns a mod.
-- Decisions on options are taken here, in the builder; the returned closures
-- only compute on traced values (no if/and/or/not on them), so they pass the
-- bytecode check that every mod goes through.

-- Captured once so that a spec redefining a global cannot change a builder.
local Lq, Lk, Hq = Lq, Lk, Hq
local lt, le, ge, eq, abs, exp2, tanh, max = lt, le, ge, eq, abs, exp2, tanh, max
local logical_and, logical_or = logical_and, logical_or
local spec_error, type, tostring = spec_error, type, tostring
local math_type = math.type

-- Builder-time helpers (never called from inside a mod).

local function fail(fname, msg)
  -- spec_error names the first line outside the prelude: the spec's call.
  spec_error(fname .. ": " .. msg)
end

local function options(opts, fname)
  if opts == nil then
    return {}
  end
  if type(opts) ~= "table" then
    fail(fname, "options must be a table (got " .. type(opts) .. ")")
  end
  return opts
end

local function is_traced(x)
  return type(x) == "userdata" and tostring(x):sub(1, 7) == "traced "
end

local function is_buffer(x)
  return type(x) == "userdata" and tostring(x):sub(1, 7) == "buffer "
end

-- A size that may be a plain positive number or a traced value (param()).
local function check_amount(x, fname, what)
  if is_traced(x) then
    return x
  end
  if type(x) ~= "number" or x <= 0 then
    fail(fname, what .. " must be a positive number or a param() "
      .. "(got " .. tostring(x) .. ")")
  end
  return x
end

local function check_align(opts, fname)
  local align = opts.align or "top_left"
  if align ~= "top_left" and align ~= "bottom_right" then
    fail(fname, "align must be \"top_left\" or \"bottom_right\" (got "
      .. tostring(align) .. ")")
  end
  return align
end

-- causal{align = "top_left" | "bottom_right"}: kv <= q. bottom_right aligns
-- the last query with the last key when Lq ~= Lk (decoding, chunked prefill).
function causal(opts)
  opts = options(opts, "causal")
  if check_align(opts, "causal") == "bottom_right" then
    return function(b, h, q, kv)
      return ge(q + (Lk - Lq), kv)
    end
  end
  return function(b, h, q, kv)
    return ge(q, kv)
  end
end

-- sliding_window(w [, {causal = true, align = ...}]): causal window of w
-- positions, kv <= q and q - kv < w. With causal = false, |q - kv| < w.
-- w is a number or a param("window", "i32").
function sliding_window(w, opts)
  w = check_amount(w, "sliding_window", "the window")
  opts = options(opts, "sliding_window")
  local bottom_right = check_align(opts, "sliding_window") == "bottom_right"
  if opts.causal == false then
    if bottom_right then
      return function(b, h, q, kv)
        return lt(abs(q + (Lk - Lq) - kv), w)
      end
    end
    return function(b, h, q, kv)
      return lt(abs(q - kv), w)
    end
  end
  if bottom_right then
    return function(b, h, q, kv)
      local qq = q + (Lk - Lq)
      return le(kv, qq) & lt(qq - kv, w)
    end
  end
  -- q - kv < w as q - max(w, 0) < kv: the same pairs (with kv <= q, a
  -- window of w <= 0 allows none either way; q - max(w, 0) cannot
  -- overflow), and the bound is computed once a query row instead of a
  -- difference on every element (three instructions an element of a masked
  -- tile instead of four).
  return function(b, h, q, kv)
    return le(kv, q) & lt(q - max(w, 0), kv)
  end
end

-- prefix_lm(p): the first p keys are visible to every query (bidirectional
-- prefix), the rest causally. p is a number or a param().
function prefix_lm(p)
  p = check_amount(p, "prefix_lm", "the prefix length")
  return function(b, h, q, kv)
    return ge(q, kv) | lt(kv, p)
  end
end

-- document(doc [, {causal = true, kv_doc = buffer}]): packed sequences; a
-- query sees only keys of its own document (doc[q] == kv_doc[kv]), causally
-- by default. doc is an i32 buffer of document ids per position; kv_doc, when
-- keys are laid out differently from queries (Lq ~= Lk), defaults to doc.
function document(doc, opts)
  if not is_buffer(doc) then
    fail("document", "doc must be a buffer(name, \"i32\") (got "
      .. tostring(doc) .. ")")
  end
  opts = options(opts, "document")
  local kv_doc = opts.kv_doc or doc
  if not is_buffer(kv_doc) then
    fail("document", "kv_doc must be a buffer (got " .. tostring(kv_doc) .. ")")
  end
  if opts.causal == false then
    return function(b, h, q, kv)
      return eq(doc[q], kv_doc[kv])
    end
  end
  return function(b, h, q, kv)
    return eq(doc[q], kv_doc[kv]) & ge(q, kv)
  end
end

-- chunked(size): chunked local attention; a query sees the keys of its own
-- chunk of `size` positions (q // size == kv // size), causally.
function chunked(size)
  size = check_amount(size, "chunked", "the chunk size")
  return function(b, h, q, kv)
    return eq(q // size, kv // size) & ge(q, kv)
  end
end

-- noop_mask(): every pair allowed. noop_score(): the score unchanged.
function noop_mask()
  return function(b, h, q, kv)
    return true
  end
end

function noop_score()
  return function(score, b, h, q, kv)
    return score
  end
end

local function collect_mods(fname, ...)
  local mods = table.pack(...)
  for i = 1, mods.n do
    if type(mods[i]) ~= "function" then
      fail(fname, "argument " .. i .. " must be a mask_mod (got "
        .. type(mods[i]) .. ")")
    end
  end
  return mods
end

-- and_masks(m1, m2, ...): allowed where every mask allows.
function and_masks(...)
  local mods = collect_mods("and_masks", ...)
  local n = mods.n
  if n == 0 then
    return noop_mask()
  end
  return function(b, h, q, kv)
    local m = mods[1](b, h, q, kv)
    for i = 2, n do
      m = logical_and(m, mods[i](b, h, q, kv))
    end
    return m
  end
end

-- or_masks(m1, m2, ...): allowed where any mask allows.
function or_masks(...)
  local mods = collect_mods("or_masks", ...)
  local n = mods.n
  if n == 0 then
    return function(b, h, q, kv)
      return false
    end
  end
  return function(b, h, q, kv)
    local m = mods[1](b, h, q, kv)
    for i = 2, n do
      m = logical_or(m, mods[i](b, h, q, kv))
    end
    return m
  end
end

-- alibi([slopes]): score + slope(h) * (kv - q).
--   alibi()          slope = 2^(-8 (h + 1) / Hq), Hq the launch's head count
--   alibi(H)         the same with a constant number of heads H
--   alibi(buffer)    slope = slopes[h], an f32 buffer of Hq slopes
function alibi(slopes)
  if slopes == nil then
    return function(score, b, h, q, kv)
      return score + exp2(-8 * (h + 1) / Hq) * (kv - q)
    end
  end
  if is_buffer(slopes) then
    return function(score, b, h, q, kv)
      return score + slopes[h] * (kv - q)
    end
  end
  if math_type(slopes) ~= "integer" or slopes <= 0 then
    fail("alibi", "expects nothing, a head count or a buffer of slopes (got "
      .. tostring(slopes) .. ")")
  end
  local heads = slopes
  return function(score, b, h, q, kv)
    return score + exp2(-8 * (h + 1) / heads) * (kv - q)
  end
end

-- softcap(c): c * tanh(score / c) (Gemma 2, Grok). c: number or param().
function softcap(c)
  c = check_amount(c, "softcap", "the cap")
  return function(score, b, h, q, kv)
    return c * tanh(score / c)
  end
end

-- relative_bias(bias [, {offset = n}]): score + bias[q - kv + offset], a
-- learned bias per relative position. offset defaults to Lk - 1, so that
-- bias holds Lq + Lk - 1 entries, relative positions -(Lk - 1) .. Lq - 1.
-- Out-of-range indices read 0.
function relative_bias(bias, opts)
  if not is_buffer(bias) then
    fail("relative_bias", "bias must be a buffer(name, \"f32\") (got "
      .. tostring(bias) .. ")")
  end
  opts = options(opts, "relative_bias")
  local offset = opts.offset or (Lk - 1)
  return function(score, b, h, q, kv)
    return score + bias[q - kv + offset]
  end
end

-- compose_scores(s1, s2, ...): applies score mods in order.
function compose_scores(...)
  local mods = collect_mods("compose_scores", ...)
  local n = mods.n
  return function(score, b, h, q, kv)
    for i = 1, n do
      score = mods[i](score, b, h, q, kv)
    end
    return score
  end
end
