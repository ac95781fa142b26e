/*
 * cli/cmd_mask.c: `flexjit mask SPEC.lua --q-len N [--kv-len M] [--block K]
 * [--param ...] [--buffer ...] [--svg FILE]`: draws a spec's mask_mod on the
 * CPU (no GPU, no NVRTC) from the CPU block-mask builder (gen/blockmask_cpu.c):
 * a text grid (elements for small sizes, blocks for large ones), the
 * density of allowed pairs, the block counts, and optionally an SVG picture.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "gen/blockmask_cpu.h"
#include "gen/interval.h"
#include "runtime/context.h"

static const char mask_usage[] =
    "usage: flexjit mask SPEC.lua --q-len N [options]\n"
    "\n"
    "Draws the mask_mod of SPEC.lua, evaluated on the CPU (no GPU needed), at\n"
    "one batch entry and query head (0, 0 unless given): a text grid of\n"
    "elements ('#' allowed, '.'\n"
    "masked) when both lengths are at most 64, else of blocks ('#' full, '+'\n"
    "partial, '.' empty; several blocks a character when there are more than\n"
    "128 a side), the density of allowed pairs and the block counts.\n"
    "\n"
    "options:\n"
    "  --q-len N           query length (required)\n"
    "  --kv-len M          key/value length (default N)\n"
    "  --block K           block size of the block view (default 128)\n"
    "  --at B,H            draw batch entry B, query head H (default 0,0); the\n"
    "                      sizes symbols B and Hq are then B+1 and H+1\n"
    "  --param NAME=VALUE  a param(NAME, \"i32\"|\"f32\") value\n"
    "  --buffer NAME=FILE.npy\n"
    "                      a buffer(NAME, dtype): 1-D int32 or float32 .npy\n"
    "  --svg FILE          also write an SVG picture of the grid to FILE\n"
    "  --help              this text\n"
    "\n"
    "Exit status: 0 ok, 1 failure, 2 usage error.\n";

enum { ELEMENT_VIEW_MAX = 64, TEXT_MAX_CELLS = 128, SVG_MAX_CELLS = 256 };

typedef struct mask_args {
  const char *spec_path, *svg_path;
  int q_len, kv_len, block;
  int at_b, at_h; /* the batch entry and head drawn */
  cli_value values[CLI_MAX_VALUES];
  int num_values;
} mask_args;

/* What the pictures are drawn from: per cell, 0 empty/masked, 1 partial,
 * 2 full/allowed (FJG_TILE_* values). */
typedef struct grid {
  int rows, cols;     /* cells */
  int per_row, per_col; /* elements or blocks per cell along q and kv */
  int elements;       /* 1: cells are elements, 0: blocks */
  uint8_t *cell;
} grid;

typedef struct mask_state {
  const mask_args *a;
  fj_context *ctx;
  fj_spec *spec;
  const fjg_graph *g;
  int32_t pi[CLI_MAX_VALUES];
  float pf[CLI_MAX_VALUES];
  const void *bdata[CLI_MAX_VALUES];
  int64_t blen[CLI_MAX_VALUES];
  float *bconv[CLI_MAX_VALUES];
  fjg_env env;
  fjg_block_mask_host bm;
} mask_state;

/* ---- arguments ---- */

static int add_value(mask_args *a, const char *text, int is_buffer) {
  char err[512];
  const char *val;
  if (a->num_values == CLI_MAX_VALUES) {
    cli_error("mask", "too many --param/--buffer values");
    return CLI_USAGE;
  }
  cli_value *v = &a->values[a->num_values];
  memset(v, 0, sizeof *v);
  if (cli_split_assign(text, v->name, sizeof v->name, &val) != 0) {
    cli_error("mask", "%s '%s': expected NAME=%s",
              is_buffer ? "--buffer" : "--param", text,
              is_buffer ? "FILE.npy" : "VALUE");
    return CLI_USAGE;
  }
  v->text = val;
  v->is_buffer = is_buffer;
  if (is_buffer && npy_read(val, &v->buffer, err, sizeof err) != 0) {
    cli_error("mask", "--buffer %s: %s", v->name, err);
    return CLI_FAIL;
  }
  a->num_values++;
  return -1;
}

static int int_value(const char *opt, const char *v, int *out) {
  long x;
  if (cli_parse_int(v, 1, 1L << 30, &x) != 0) {
    cli_error("mask", "%s: '%s' is not an integer in [1, 2^30]", opt, v);
    return CLI_USAGE;
  }
  *out = (int)x;
  return -1;
}

/* -1 to go on, else an exit status. */
static int parse_one(int argc, char **argv, int *i, mask_args *a) {
  static const char *const opts[] = {"--q-len", "--kv-len", "--block",
                                     "--param", "--buffer", "--svg", "--at",
                                     NULL};
  const char *arg = argv[*i], *v;
  if (cli_is_help(arg)) {
    fputs(mask_usage, stdout);
    return CLI_OK;
  }
  for (int k = 0; opts[k]; k++) {
    int m = cli_opt_value(argc, argv, i, opts[k], &v);
    if (m < 0) {
      cli_error("mask", "%s needs a value", arg);
      return CLI_USAGE;
    }
    if (m == 0) continue;
    if (k == 0) return int_value(opts[k], v, &a->q_len);
    if (k == 1) return int_value(opts[k], v, &a->kv_len);
    if (k == 2) return int_value(opts[k], v, &a->block);
    if (k == 3 || k == 4) return add_value(a, v, k == 4);
    if (k == 6) {
      char extra;
      if (sscanf(v, "%d,%d%c", &a->at_b, &a->at_h, &extra) != 2 ||
          a->at_b < 0 || a->at_h < 0 || a->at_b > 65534 || a->at_h > 65534) {
        cli_error("mask", "--at: '%s' is not B,H (two indices >= 0)", v);
        return CLI_USAGE;
      }
      return -1;
    }
    a->svg_path = v;
    return -1;
  }
  if (arg[0] == '-' && arg[1]) {
    cli_error("mask", "unknown option '%s' (see --help)", arg);
    return CLI_USAGE;
  }
  if (a->spec_path) {
    cli_error("mask", "more than one spec given ('%s', '%s')", a->spec_path,
              arg);
    return CLI_USAGE;
  }
  a->spec_path = arg;
  return -1;
}

/* ---- runtime values (host copies: the CPU evaluator reads them) ---- */

static const cli_value *find_value(const mask_args *a, const char *name) {
  for (int i = 0; i < a->num_values; i++)
    if (!strcmp(a->values[i].name, name)) return &a->values[i];
  return NULL;
}

static int bind_one(mask_state *s, int i, const fjg_arg *d,
                    const cli_value *v) {
  long n;
  double f;
  if ((d->kind == FJ_ARG_BUFFER) != v->is_buffer) {
    cli_error("mask", "'%s' is a %s of the spec: pass %s %s=%s", d->name,
              v->is_buffer ? "param" : "buffer",
              v->is_buffer ? "--param" : "--buffer", d->name,
              v->is_buffer ? "VALUE" : "FILE.npy");
    return CLI_USAGE;
  }
  if (d->kind == FJ_ARG_I32 && cli_parse_int(v->text, INT32_MIN, INT32_MAX, &n) == 0)
    return s->pi[i] = (int32_t)n, -1;
  if (d->kind == FJ_ARG_F32 && cli_parse_float(v->text, &f) == 0)
    return s->pf[i] = (float)f, -1;
  if (d->kind != FJ_ARG_BUFFER) {
    cli_error("mask", "--param %s: '%s' is not an %s", d->name, v->text,
              fjg_type_name(d->type));
    return CLI_USAGE;
  }
  const npy_array *b = &v->buffer;
  if (b->ndim != 1 || (d->type == FJG_I32) != (b->dtype == NPY_I32)) {
    cli_error("mask", "--buffer %s: expected a 1-D %s array, %s holds %s",
              d->name, d->type == FJG_I32 ? "int32" : "float32", v->text,
              npy_dtype_descr(b->dtype));
    return CLI_USAGE;
  }
  s->bdata[i] = b->data;
  if (b->dtype == NPY_F64) {
    if (!(s->bconv[i] = npy_to_f32(b))) return CLI_FAIL;
    s->bdata[i] = s->bconv[i];
  }
  s->blen[i] = (int64_t)b->count;
  return -1;
}

static int bind_values(mask_state *s) {
  int n = fj_spec_num_args(s->spec), rc;
  if (n > CLI_MAX_VALUES) {
    cli_error("mask", "spec declares more than %d values", CLI_MAX_VALUES);
    return CLI_FAIL;
  }
  for (int i = 0; i < n; i++) {
    const fjg_arg *d = fjg_arg_at(s->g, i);
    const cli_value *v = find_value(s->a, d->name);
    if (!v) {
      int buf = d->kind == FJ_ARG_BUFFER;
      cli_error("mask", "spec '%s' declares %s '%s': pass %s %s=%s",
                fj_spec_name(s->spec), buf ? "buffer" : "param", d->name,
                buf ? "--buffer" : "--param", d->name,
                buf ? "FILE.npy" : "VALUE");
      return CLI_USAGE;
    }
    if ((rc = bind_one(s, i, d, v)) >= 0) return rc;
  }
  for (int i = 0; i < s->a->num_values; i++)
    if (fjg_find_arg(s->g, s->a->values[i].name) < 0) {
      cli_error("mask", "spec '%s' declares no param or buffer named '%s'",
                fj_spec_name(s->spec), s->a->values[i].name);
      return CLI_USAGE;
    }
  s->env.param_i32 = s->pi;
  s->env.param_f32 = s->pf;
  s->env.buffer_data = s->bdata;
  s->env.buffer_len = s->blen;
  s->env.sizes[FJG_SZ_B] = s->a->at_b + 1;
  s->env.sizes[FJG_SZ_HQ] = s->env.sizes[FJG_SZ_HKV] = s->a->at_h + 1;
  s->env.sizes[FJG_SZ_LQ] = s->a->q_len;
  s->env.sizes[FJG_SZ_LK] = s->a->kv_len;
  return -1;
}

/* ---- grids ---- */

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

static int element_grid(const mask_state *s, grid *g) {
  g->rows = s->a->q_len, g->cols = s->a->kv_len;
  g->per_row = g->per_col = 1;
  g->elements = 1;
  g->cell = malloc((size_t)g->rows * g->cols);
  if (!g->cell) return 0;
  for (int q = 0; q < g->rows; q++)
    for (int kv = 0; kv < g->cols; kv++)
      g->cell[(size_t)q * g->cols + kv] =
          fjg_eval_mask(s->g, &s->env, s->a->at_b, s->a->at_h, q, kv)
              ? FJG_TILE_FULL
                                                    : FJG_TILE_EMPTY;
  return 1;
}

/* Offset of the drawn (b, h) in the block mask's [B][H][nq][nkv] classes
 * (B and H are 1 when the mask does not read them: broadcast). */
static size_t block_row(const mask_state *s) {
  const fjg_block_mask_host *m = &s->bm;
  size_t b = m->B > 1 ? (size_t)s->a->at_b : 0;
  size_t h = m->H > 1 ? (size_t)s->a->at_h : 0;
  return (b * (size_t)m->H + h) * (size_t)m->nq * (size_t)m->nkv;
}

/* Blocks, max_cells a side at most: a cell covering several blocks is full
 * or empty only when all of them are. */
static int block_grid(const mask_state *s, int max_cells, grid *g) {
  const fjg_block_mask_host *m = &s->bm;
  g->per_row = ceil_div(m->nq, max_cells);
  g->per_col = ceil_div(m->nkv, max_cells);
  g->rows = ceil_div(m->nq, g->per_row);
  g->cols = ceil_div(m->nkv, g->per_col);
  g->elements = 0;
  g->cell = malloc((size_t)g->rows * g->cols);
  if (!g->cell) return 0;
  for (int r = 0; r < g->rows; r++)
    for (int c = 0; c < g->cols; c++) {
      int full = 0, empty = 0, n = 0;
      for (int i = r * g->per_row; i < m->nq && i < (r + 1) * g->per_row; i++)
        for (int j = c * g->per_col; j < m->nkv && j < (c + 1) * g->per_col;
             j++) {
          uint8_t k = m->cls[block_row(s) + (size_t)i * m->nkv + j];
          full += k == FJG_TILE_FULL, empty += k == FJG_TILE_EMPTY, n++;
        }
      g->cell[(size_t)r * g->cols + c] = full == n    ? FJG_TILE_FULL
                                         : empty == n ? FJG_TILE_EMPTY
                                                      : FJG_TILE_PARTIAL;
    }
  return 1;
}

static void print_grid(const grid *g) {
  static const char glyph[3] = {'.', '+', '#'};
  if (g->elements)
    printf("legend  '#' allowed  '.' masked   (rows q, columns kv)\n");
  else
    printf("legend  '#' full  '+' partial  '.' empty   (rows q blocks, "
           "columns kv blocks; a character is %d x %d blocks)\n",
           g->per_row, g->per_col);
  char *line = malloc((size_t)g->cols + 1);
  if (!line) return;
  for (int r = 0; r < g->rows; r++) {
    for (int c = 0; c < g->cols; c++)
      line[c] = glyph[g->cell[(size_t)r * g->cols + c]];
    line[g->cols] = '\0';
    printf("%s\n", line);
  }
  free(line);
}

/* ---- SVG ---- */

static void svg_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '&') fputs("&amp;", f);
    else fputc(*s, f);
  }
}

static void svg_legend_item(FILE *f, int x, int y, const char *color,
                            const char *label) {
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\" "
             "stroke=\"#555\"/>\n", x, y, color);
  fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", x + 20, y + 12, label);
}

static int write_svg(const mask_state *s, const grid *g, double density,
                     const char *path) {
  static const char *const fill[3] = {"#ffffff", "#8fb3e8", "#1f4e9a"};
  const int margin = 40, legend = 70;
  int cell = 512 / (g->rows > g->cols ? g->rows : g->cols);
  if (cell < 2) cell = 2;
  int w = g->cols * cell, h = g->rows * cell;
  FILE *f = fopen(path, "w");
  if (!f) {
    cli_error("mask", "--svg: cannot write %s", path);
    return 0;
  }
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
             "height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n",
          w + 2 * margin, h + margin + legend);
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"#f7f7f7\"/>\n");
  fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"14\">", margin);
  svg_escape(f, fj_spec_name(s->spec));
  fprintf(f, ": Lq %d x Lk %d, density %.4f</text>\n", s->a->q_len,
          s->a->kv_len, density);
  fprintf(f, "<g transform=\"translate(%d,%d)\">\n", margin, margin);
  fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"#555\"/>\n",
          w, h, fill[0]);
  for (int r = 0; r < g->rows; r++)
    for (int c = 0; c < g->cols; c++) {
      uint8_t k = g->cell[(size_t)r * g->cols + c];
      if (k != FJG_TILE_EMPTY)
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                   "fill=\"%s\"/>\n", c * cell, r * cell, cell, cell, fill[k]);
    }
  fprintf(f, "</g>\n");
  int ly = margin + h + 20;
  if (g->elements) {
    svg_legend_item(f, margin, ly, fill[2], "allowed");
    svg_legend_item(f, margin + 110, ly, fill[0], "masked");
  } else {
    svg_legend_item(f, margin, ly, fill[2], "full block");
    svg_legend_item(f, margin + 110, ly, fill[1], "partial block");
    svg_legend_item(f, margin + 240, ly, fill[0], "empty block");
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\">rows: q%s, columns: kv%s (%d x %d a "
             "cell)</text>\n</svg>\n",
          margin, ly + 36, g->elements ? "" : " blocks",
          g->elements ? "" : " blocks", g->per_row, g->per_col);
  if (fclose(f) != 0) {
    cli_error("mask", "--svg: writing %s failed", path);
    return 0;
  }
  return 1;
}

/* ---- the command ---- */

static void print_summary(const mask_state *s, int64_t allowed) {
  const fjg_block_mask_host *m = &s->bm;
  int64_t counts[3] = {0, 0, 0};
  const uint8_t *cls = m->cls + block_row(s);
  for (size_t t = 0; t < (size_t)m->nq * m->nkv; t++) counts[cls[t]]++;
  double total = (double)m->q_len * m->kv_len;
  double tiles = (double)m->nq * m->nkv;
  printf("mask    %s (%s): Lq %d x Lk %d, b %d h %d%s\n",
         fj_spec_name(s->spec), s->a->spec_path, m->q_len, m->kv_len,
         s->a->at_b, s->a->at_h,
         fjg_mask_is_index_only(s->g) ? "" : ", reads buffers");
  printf("density %.6f (%lld of %.0f pairs allowed)\n",
         (double)allowed / total, (long long)allowed, total);
  printf("blocks  %d x %d of %d x %d: %lld full, %lld partial, %lld empty "
         "(%.1f%% of blocks skipped)\n",
         m->nq, m->nkv, m->block_q, m->block_kv, (long long)counts[2],
         (long long)counts[1], (long long)counts[0],
         100.0 * (double)counts[0] / tiles);
}

static int run_mask(mask_state *s) {
  const mask_args *a = s->a;
  /* Only the drawn entry is needed; B and H span up to it when the mask
   * reads b or h (then the builder evaluates each). */
  unsigned deps = fjg_input_deps(s->g, fjg_mask_root(s->g));
  int B = deps & (1u << FJG_IN_B) ? a->at_b + 1 : 1;
  int H = deps & (1u << FJG_IN_H) ? a->at_h + 1 : 1;
  fj_status st = fjg_block_mask_cpu_build(s->g, &s->env, B, H, a->q_len,
                                          a->kv_len, a->block, a->block,
                                          &s->bm);
  if (st != FJ_OK) {
    cli_error("mask", "building the block mask failed: %s", fj_strerror(st));
    return CLI_FAIL;
  }
  int64_t allowed = fjg_block_mask_count_allowed(
      s->g, &s->env, &s->bm, B > 1 ? a->at_b : 0, H > 1 ? a->at_h : 0);
  print_summary(s, allowed);
  int small = a->q_len <= ELEMENT_VIEW_MAX && a->kv_len <= ELEMENT_VIEW_MAX;
  grid text = {0}, pic = {0};
  int ok = small ? element_grid(s, &text) : block_grid(s, TEXT_MAX_CELLS, &text);
  if (ok) print_grid(&text);
  if (ok && a->svg_path) {
    int svg_elements = a->q_len <= SVG_MAX_CELLS && a->kv_len <= SVG_MAX_CELLS;
    ok = svg_elements ? element_grid(s, &pic)
                      : block_grid(s, SVG_MAX_CELLS, &pic);
    ok = ok && write_svg(s, &pic, (double)allowed / ((double)a->q_len *
                                                     a->kv_len), a->svg_path);
    if (ok) printf("svg     %s\n", a->svg_path);
  }
  free(text.cell);
  free(pic.cell);
  if (!ok && !a->svg_path) cli_error("mask", "out of memory");
  return ok ? CLI_OK : CLI_FAIL;
}

static int open_spec(mask_state *s) {
  fj_context_options o;
  fj_context_options_init(&o);
  o.cache_dir = ""; /* nothing is compiled */
  if (fj_context_create(&o, &s->ctx) != FJ_OK) {
    cli_error("mask", "cannot create a context");
    return CLI_FAIL;
  }
  if (fj_spec_load_file(s->ctx, s->a->spec_path, &s->spec) != FJ_OK) {
    cli_error("mask", "%s", fj_context_last_error(s->ctx));
    return CLI_FAIL;
  }
  s->g = fjr_spec_graph(s->spec);
  return -1;
}

int fj_cli_mask(int argc, char **argv) {
  mask_args a;
  mask_state s;
  int rc = -1;
  memset(&a, 0, sizeof a);
  memset(&s, 0, sizeof s);
  a.block = 128;
  for (int i = 1; i < argc && rc < 0; i++) rc = parse_one(argc, argv, &i, &a);
  if (rc < 0 && !a.spec_path) {
    cli_error("mask", "no spec given (usage: flexjit mask SPEC.lua --q-len N)");
    rc = CLI_USAGE;
  }
  if (rc < 0 && !a.q_len) {
    cli_error("mask", "--q-len is required (see --help)");
    rc = CLI_USAGE;
  }
  if (rc < 0 && !a.kv_len) a.kv_len = a.q_len;
  s.a = &a;
  if (rc < 0) rc = open_spec(&s);
  if (rc < 0) rc = bind_values(&s);
  if (rc < 0) rc = run_mask(&s);
  fjg_block_mask_host_free(&s.bm);
  for (int i = 0; i < CLI_MAX_VALUES; i++) free(s.bconv[i]);
  fj_spec_destroy(s.spec);
  fj_context_destroy(s.ctx);
  cli_values_free(a.values, a.num_values);
  return rc;
}
