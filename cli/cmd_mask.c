/*
 * cli/cmd_mask.c: `flexjit mask SPEC.lua --q-len N [--kv-len M] [--block K]
 * [--param ...] [--buffer ...] [--svg FILE]`: draws a spec's mask_mod on the
 * CPU (no GPU, no NVRTC) from the census of gen/blockmask_cpu.c: a text grid
 * (elements for small sizes, blocks for large ones), the density of allowed
 * pairs, the block counts, the pairs the CPU cannot decide the kernel's way
 * (uncertain, gen/eval.h), and optionally an SVG picture. Its work is
 * bounded: at most MAX_BLOCKS blocks and --work-limit (default
 * DEFAULT_WORK_LIMIT) mask node evaluations, else an error names the limit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "gen/blockmask_cpu.h"
#include "gen/eval.h"
#include "gen/interval.h"
#include "runtime/context.h"

static const char mask_usage[] =
    "usage: flexjit mask SPEC.lua --q-len N [options]\n"
    "\n"
    "Draws the mask_mod of SPEC.lua, evaluated on the CPU (no GPU needed), at\n"
    "one batch entry and query head (0, 0 unless given): a text grid of\n"
    "elements ('#' allowed, '.' masked, '?' uncertain) when both lengths are\n"
    "at most 64, else of blocks ('#' full, '+' partial, '.' empty, '?' holding\n"
    "uncertain pairs; several blocks a character when there are more than 128\n"
    "a side), the density of allowed pairs and the block counts.\n"
    "\n"
    "Uncertain pairs are those where the kernel's float32 exp, exp2, log, log2,\n"
    "tanh (or fminf/fmaxf of two zeros) may decide the mask either way: their\n"
    "error bounds straddle a comparison. They are counted apart from the\n"
    "allowed ones, and their blocks are partial (the kernel evaluates them).\n"
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
    "                      (elements up to 256 a side, else blocks)\n"
    "  --work-limit W      at most W mask node evaluations (default 2^31,\n"
    "                      about 7 s on one core)\n"
    "  --help              this text\n"
    "\n"
    "Limits: at most 4194304 blocks (ceil(N/K) x ceil(M/K)) and the work\n"
    "limit. Tiles that interval analysis decides cost next to nothing, so\n"
    "index-only masks such as causal or sliding windows stay cheap up to\n"
    "lengths of millions, while masks that read buffers cost one evaluation\n"
    "of the mask's nodes per pair not proven empty (a causal document mask\n"
    "of 10 nodes at 16384: 1.3 x 10^9). Over a limit the command stops with\n"
    "an error naming it.\n"
    "\n"
    "Exit status: 0 ok, 1 failure, 2 usage error.\n";

/* Element views up to 64 (text) and 256 (SVG) a side; block views of at
 * most 128 (text) and 256 (SVG) characters a side. MAX_BLOCKS bounds the
 * class matrix (4 MiB), the work limit the mask evaluations (fjg_census.work,
 * about 3 x 10^8 node evaluations a second). */
enum { ELEMENT_VIEW_MAX = 64, TEXT_MAX_CELLS = 128, SVG_MAX_CELLS = 256 };
#define MAX_BLOCKS (1LL << 22)
#define DEFAULT_WORK_LIMIT ((uint64_t)1 << 31)

/* Cell values: FJG_TILE_* (masked/partial/allowed) and UNCERTAIN_CELL. */
enum { UNCERTAIN_CELL = 3 };

typedef struct mask_args {
  const char *spec_path, *svg_path;
  int q_len, kv_len, block;
  int at_b, at_h; /* the batch entry and head drawn */
  uint64_t work_limit;
  cli_value values[CLI_MAX_VALUES];
  int num_values;
} mask_args;

/* What the pictures are drawn from: per cell, 0 empty/masked, 1 partial,
 * 2 full/allowed (FJG_TILE_* values), 3 uncertain (a pair, or a block or
 * cell holding uncertain pairs). */
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
  int nq, nkv;
  uint8_t *cls;        /* nq x nkv census classes of the drawn (b, h) */
  fjg_census census;
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
                                     "--work-limit", NULL};
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
    if (k == 7) {
      char *end;
      unsigned long long w = strtoull(v, &end, 0);
      if (!*v || *end || v[0] == '-' || w < 1) {
        cli_error("mask", "--work-limit: '%s' is not a positive integer", v);
        return CLI_USAGE;
      }
      a->work_limit = w;
      return -1;
    }
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

/* Elements, evaluated here (only drawn at small sizes). */
static int element_grid(mask_state *s, grid *g) {
  static const uint8_t cell_of[3] = {FJG_TILE_EMPTY, FJG_TILE_FULL,
                                     UNCERTAIN_CELL};
  fjg_evaluator e;
  g->rows = s->a->q_len, g->cols = s->a->kv_len;
  g->per_row = g->per_col = 1;
  g->elements = 1;
  g->cell = malloc((size_t)g->rows * g->cols);
  if (!g->cell || fjg_evaluator_init(&e, s->g, &s->env) != FJ_OK) return 0;
  for (int q = 0; q < g->rows; q++)
    for (int kv = 0; kv < g->cols; kv++)
      g->cell[(size_t)q * g->cols + kv] =
          cell_of[fjg_eval_mask3(&e, s->a->at_b, s->a->at_h, q, kv)];
  fjg_evaluator_free(&e);
  return 1;
}

/* Blocks, max_cells a side at most: a cell covering several blocks is full
 * or empty only when all of them are, uncertain when one of them holds
 * uncertain pairs. */
static int block_grid(const mask_state *s, int max_cells, grid *g) {
  g->per_row = ceil_div(s->nq, max_cells);
  g->per_col = ceil_div(s->nkv, max_cells);
  g->rows = ceil_div(s->nq, g->per_row);
  g->cols = ceil_div(s->nkv, g->per_col);
  g->elements = 0;
  g->cell = malloc((size_t)g->rows * g->cols);
  if (!g->cell) return 0;
  for (int r = 0; r < g->rows; r++)
    for (int c = 0; c < g->cols; c++) {
      int full = 0, empty = 0, uncertain = 0, n = 0;
      for (int i = r * g->per_row; i < s->nq && i < (r + 1) * g->per_row; i++)
        for (int j = c * g->per_col; j < s->nkv && j < (c + 1) * g->per_col;
             j++) {
          uint8_t k = s->cls[(size_t)i * s->nkv + j];
          uncertain |= k & FJG_BLOCK_UNCERTAIN;
          k &= (uint8_t)~FJG_BLOCK_UNCERTAIN;
          full += k == FJG_TILE_FULL, empty += k == FJG_TILE_EMPTY, n++;
        }
      g->cell[(size_t)r * g->cols + c] = uncertain    ? UNCERTAIN_CELL
                                         : full == n  ? FJG_TILE_FULL
                                         : empty == n ? FJG_TILE_EMPTY
                                                      : FJG_TILE_PARTIAL;
    }
  return 1;
}

static void print_grid(const grid *g) {
  static const char glyph[4] = {'.', '+', '#', '?'};
  if (g->elements)
    printf("legend  '#' allowed  '.' masked  '?' uncertain   (rows q, "
           "columns kv)\n");
  else
    printf("legend  '#' full  '+' partial  '.' empty  '?' holds uncertain "
           "pairs   (rows q blocks, columns kv blocks; a character is %d x %d "
           "blocks)\n",
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
  static const char *const fill[4] = {"#ffffff", "#8fb3e8", "#1f4e9a",
                                      "#e8a33d"};
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
    svg_legend_item(f, margin + 220, ly, fill[3], "uncertain");
  } else {
    svg_legend_item(f, margin, ly, fill[2], "full block");
    svg_legend_item(f, margin + 110, ly, fill[1], "partial block");
    svg_legend_item(f, margin + 240, ly, fill[0], "empty block");
    svg_legend_item(f, margin + 360, ly, fill[3], "uncertain pairs");
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

static void print_summary(const mask_state *s) {
  const mask_args *a = s->a;
  int64_t counts[3] = {0, 0, 0}, with_uncertain = 0;
  for (size_t t = 0; t < (size_t)s->nq * s->nkv; t++) {
    counts[s->cls[t] & 3]++;
    with_uncertain += (s->cls[t] & FJG_BLOCK_UNCERTAIN) != 0;
  }
  double total = (double)a->q_len * a->kv_len;
  double tiles = (double)s->nq * s->nkv;
  printf("mask    %s (%s): Lq %d x Lk %d, b %d h %d%s\n",
         fj_spec_name(s->spec), a->spec_path, a->q_len, a->kv_len, a->at_b,
         a->at_h, fjg_mask_is_index_only(s->g) ? "" : ", reads buffers");
  printf("density %.6f (%lld of %.0f pairs allowed)\n",
         (double)s->census.allowed / total, (long long)s->census.allowed,
         total);
  if (s->census.uncertain)
    printf("uncertain %lld pairs (%.6f) in %lld blocks: the kernel's float32 "
           "exp/log/tanh may decide them either way (not counted as allowed)\n",
           (long long)s->census.uncertain,
           (double)s->census.uncertain / total, (long long)with_uncertain);
  printf("blocks  %d x %d of %d x %d: %lld full, %lld partial, %lld empty "
         "(%.1f%% of blocks skipped)\n",
         s->nq, s->nkv, a->block, a->block, (long long)counts[2],
         (long long)counts[1], (long long)counts[0],
         100.0 * (double)counts[0] / tiles);
}

static int count_mask(mask_state *s) {
  const mask_args *a = s->a;
  s->nq = ceil_div(a->q_len, a->block);
  s->nkv = ceil_div(a->kv_len, a->block);
  if ((long long)s->nq * s->nkv > MAX_BLOCKS) {
    cli_error("mask", "%d x %d blocks of %d: more than %lld blocks, the "
              "limit of flexjit mask (use a larger --block)", s->nq, s->nkv,
              a->block, MAX_BLOCKS);
    return CLI_USAGE;
  }
  s->cls = malloc((size_t)s->nq * s->nkv);
  if (!s->cls) {
    cli_error("mask", "out of memory");
    return CLI_FAIL;
  }
  fj_status st = fjg_mask_census(s->g, &s->env, a->at_b, a->at_h, a->q_len,
                                 a->kv_len, a->block, a->block, a->work_limit,
                                 s->cls, &s->census);
  if (st == FJ_EUNSUPPORTED) {
    cli_error("mask", "counting this mask over Lq %d x Lk %d needs more than "
              "%llu mask node evaluations (--work-limit; interval analysis "
              "does not decide enough of its tiles): use smaller "
              "--q-len/--kv-len or a larger --work-limit", a->q_len,
              a->kv_len, (unsigned long long)a->work_limit);
    return CLI_FAIL;
  }
  if (st != FJ_OK) {
    cli_error("mask", "counting the mask failed: %s", fj_strerror(st));
    return CLI_FAIL;
  }
  return -1;
}

static int run_mask(mask_state *s) {
  const mask_args *a = s->a;
  int rc = count_mask(s);
  if (rc >= 0) return rc;
  print_summary(s);
  int small = a->q_len <= ELEMENT_VIEW_MAX && a->kv_len <= ELEMENT_VIEW_MAX;
  grid text = {0}, pic = {0};
  int ok = small ? element_grid(s, &text) : block_grid(s, TEXT_MAX_CELLS, &text);
  if (ok) print_grid(&text);
  if (ok && a->svg_path) {
    int svg_elements = a->q_len <= SVG_MAX_CELLS && a->kv_len <= SVG_MAX_CELLS;
    ok = svg_elements ? element_grid(s, &pic)
                      : block_grid(s, SVG_MAX_CELLS, &pic);
    ok = ok && write_svg(s, &pic, (double)s->census.allowed /
                                      ((double)a->q_len * a->kv_len),
                         a->svg_path);
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
  a.work_limit = DEFAULT_WORK_LIMIT;
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
  free(s.cls);
  for (int i = 0; i < CLI_MAX_VALUES; i++) free(s.bconv[i]);
  fj_spec_destroy(s.spec);
  fj_context_destroy(s.ctx);
  cli_values_free(a.values, a.num_values);
  return rc;
}
