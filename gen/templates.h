/*
 * gen/templates.h: the CUDA templates embedded at build time.
 *
 * cmake/embed.cmake turns every .cuh file under templates/ into a table keyed
 * by its path relative to templates/ ("common/fj_common.cuh",
 * "sm80/fwd.cuh"), sorted by path. The texts are static and NUL-terminated.
 */
#ifndef FJG_TEMPLATES_H
#define FJG_TEMPLATES_H

#include <stddef.h>

#include "gen/graph.h"

/* Where a part list (fjg_template_parts) puts the generated code of the
 * spec: the interval rules and the prologue (gen/emit_cuda.h). */
#define FJG_PART_PROLOGUE "(prologue)"

/* The parts of one kernel's translation unit, in the order they are pasted
 * after the configuration #defines: template names, and FJG_PART_PROLOGUE
 * where the spec's generated code goes. NULL-terminated, static; NULL when
 * template_name has no such kernel. Kernels: "forward" of "sm80" and
 * "sm90", "backward" of "sm80" (its three kernels, docs/backward.md),
 * "blockmask" of "common" (the block-mask builder, whose kernels
 * gen/emit_blockmask.c appends). */
const char *const *fjg_template_parts(const char *template_name, const char *kernel);

/* Text of the template `name` (borrowed, static) and its size in bytes, or
 * NULL when there is no such template. `len` may be NULL. */
const char *fjg_template_text(const char *name, size_t *len);

/* Number of embedded templates, and the name of the i-th (NULL when out of
 * range), in table order. */
int fjg_template_count_get(void);
const char *fjg_template_name_at(int i);

/* Appends every template, in table order, as u32 name length, name bytes,
 * u64 size, text bytes (little-endian), so a cache key can cover all the
 * template code a kernel may have been built from. */
void fjg_templates_append_all(fjg_buf *out);

#endif /* FJG_TEMPLATES_H */
