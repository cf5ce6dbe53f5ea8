/* snapshot_scan.c: reads a PyTorch memory snapshot (a pickle) at C speed, safely, and explains it.
 *
 * Loaded by torchscalpel.memory.snapshot_native through ctypes (no Python or torch headers), compiled on
 * first use. Nothing here is a Python object and nothing is imported or called: the file is evaluated by a
 * small pickle machine that knows only plain data (None, booleans, numbers, strings, bytes, lists, tuples,
 * dicts, sets), and the explanation (the same one snapshot.py's SnapshotSummary builds from the
 * pure-Python reader) is accumulated in C while the file is read.
 *
 *   pass 1 (ts_scan): refuses every opcode that is not plain data (globals, calls, object builds,
 *     persistent ids, extension codes, out-of-band buffers) with its byte offset, before pass 2 builds
 *     anything; notes which memo keys are ever fetched, and which more than once; finds the root dict's
 *     children and the lists nested in its lists (by byte offset).
 *   pass 2 (ts_eval): builds values. The root's `segments` list and the lists inside `device_traces` are
 *     streamed: each segment and each trace event is summarized as it is appended and then freed, so a
 *     1 GB snapshot never exists in memory at once. The memo keeps only the keys pass 1 saw fetched (a
 *     key fetched once is let go after that fetch); a block's traceback that the memo must keep for a
 *     later trace event is cut down to the call site it was summarized to.
 *
 * Values are 16 bytes; strings point into the read-only mapping of the file, so reading copies no text.
 * Containers are reference-counted nodes. Pages behind the cursor are dropped (MADV_DONTNEED) every
 * 32 MiB, so the resident size stays bounded however large the file; a string used later faults its
 * page back.
 */
#define _GNU_SOURCE  /* memmem */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { E_OK = 0, E_REFUSED = 1, E_TRUNCATED = 2, E_NOTPICKLE = 3, E_SHAPE = 4, E_NOMEM = 5, E_IO = 6, E_NOSEG = 7, E_WORK = 8,
       E_RANGE = 9 };
/* Sums of sizes are kept exact in 128 bits (each term is an int64, and the walk is bounded far below 2^64
   terms), as Python keeps them; a figure that does not fit in 64 bits at the end is E_RANGE, refused by both
   readers alike (snapshot.py's OutOfRange). Wrapping would give a number no device holds. */
typedef __int128 acc_t;
/* op kinds */
enum { K_PUSH, K_NONE, K_MARK, K_STOP, K_POP, K_POPMARK, K_APPEND, K_APPENDS, K_SETITEM, K_SETITEMS,
       K_FROMMARK, K_TUPLE2, K_TUPLE3, K_ADDITEMS, K_MEMOIZE, K_PUT, K_GET, K_FRAME, K_REFUSE, K_UNKNOWN };
/* argument kinds */
enum { A_NONE, A_FIX, A_LINE, A_LEN1, A_LEN4, A_LEN8 };

typedef struct { uint8_t kind, arg, n; } opinfo_t;
static opinfo_t OPS[256];
static const char *NAMES[256];
static int ops_ready = 0;

static void def(int c, const char *name, uint8_t kind, uint8_t arg, uint8_t n) {
  OPS[c].kind = kind; OPS[c].arg = arg; OPS[c].n = n; NAMES[c] = name;
}

static void init_ops(void) {
  if (ops_ready) return;
  for (int i = 0; i < 256; i++) { OPS[i].kind = K_UNKNOWN; NAMES[i] = "?"; }
  def('(', "MARK", K_MARK, A_NONE, 0);          def('.', "STOP", K_STOP, A_NONE, 0);
  def('0', "POP", K_POP, A_NONE, 0);            def('1', "POP_MARK", K_POPMARK, A_NONE, 0);
  def('2', "DUP", K_PUSH, A_NONE, 0);           def('F', "FLOAT", K_PUSH, A_LINE, 0);
  def('I', "INT", K_PUSH, A_LINE, 0);           def('J', "BININT", K_PUSH, A_FIX, 4);
  def('K', "BININT1", K_PUSH, A_FIX, 1);        def('L', "LONG", K_PUSH, A_LINE, 0);
  def('M', "BININT2", K_PUSH, A_FIX, 2);        def('N', "NONE", K_PUSH, A_NONE, 0);
  def('P', "PERSID", K_REFUSE, A_LINE, 0);      def('Q', "BINPERSID", K_REFUSE, A_NONE, 0);
  def('R', "REDUCE", K_REFUSE, A_NONE, 0);      def('S', "STRING", K_PUSH, A_LINE, 0);
  def('T', "BINSTRING", K_PUSH, A_LEN4, 0);     def('U', "SHORT_BINSTRING", K_PUSH, A_LEN1, 0);
  def('V', "UNICODE", K_PUSH, A_LINE, 0);       def('X', "BINUNICODE", K_PUSH, A_LEN4, 0);
  def('a', "APPEND", K_APPEND, A_NONE, 0);      def('b', "BUILD", K_REFUSE, A_NONE, 0);
  def('c', "GLOBAL", K_REFUSE, A_LINE, 0);      def('d', "DICT", K_FROMMARK, A_NONE, 0);
  def('}', "EMPTY_DICT", K_PUSH, A_NONE, 0);    def('e', "APPENDS", K_APPENDS, A_NONE, 0);
  def('g', "GET", K_GET, A_LINE, 0);            def('h', "BINGET", K_GET, A_FIX, 1);
  def('i', "INST", K_REFUSE, A_LINE, 0);        def('j', "LONG_BINGET", K_GET, A_FIX, 4);
  def('l', "LIST", K_FROMMARK, A_NONE, 0);      def(']', "EMPTY_LIST", K_PUSH, A_NONE, 0);
  def('o', "OBJ", K_REFUSE, A_NONE, 0);         def('p', "PUT", K_PUT, A_LINE, 0);
  def('q', "BINPUT", K_PUT, A_FIX, 1);          def('r', "LONG_BINPUT", K_PUT, A_FIX, 4);
  def('s', "SETITEM", K_SETITEM, A_NONE, 0);    def('t', "TUPLE", K_FROMMARK, A_NONE, 0);
  def(')', "EMPTY_TUPLE", K_PUSH, A_NONE, 0);   def('u', "SETITEMS", K_SETITEMS, A_NONE, 0);
  def('G', "BINFLOAT", K_PUSH, A_FIX, 8);       def(0x80, "PROTO", K_NONE, A_FIX, 1);
  def(0x81, "NEWOBJ", K_REFUSE, A_NONE, 0);     def(0x82, "EXT1", K_REFUSE, A_FIX, 1);
  def(0x83, "EXT2", K_REFUSE, A_FIX, 2);        def(0x84, "EXT4", K_REFUSE, A_FIX, 4);
  def(0x85, "TUPLE1", K_NONE, A_NONE, 0);       def(0x86, "TUPLE2", K_TUPLE2, A_NONE, 0);
  def(0x87, "TUPLE3", K_TUPLE3, A_NONE, 0);     def(0x88, "NEWTRUE", K_PUSH, A_NONE, 0);
  def(0x89, "NEWFALSE", K_PUSH, A_NONE, 0);     def(0x8a, "LONG1", K_PUSH, A_LEN1, 0);
  def(0x8b, "LONG4", K_PUSH, A_LEN4, 0);        def('B', "BINBYTES", K_PUSH, A_LEN4, 0);
  def('C', "SHORT_BINBYTES", K_PUSH, A_LEN1, 0); def(0x8c, "SHORT_BINUNICODE", K_PUSH, A_LEN1, 0);
  def(0x8d, "BINUNICODE8", K_PUSH, A_LEN8, 0);  def(0x8e, "BINBYTES8", K_PUSH, A_LEN8, 0);
  def(0x8f, "EMPTY_SET", K_PUSH, A_NONE, 0);    def(0x90, "ADDITEMS", K_ADDITEMS, A_NONE, 0);
  def(0x91, "FROZENSET", K_FROMMARK, A_NONE, 0); def(0x92, "NEWOBJ_EX", K_REFUSE, A_NONE, 0);
  def(0x93, "STACK_GLOBAL", K_REFUSE, A_NONE, 0); def(0x94, "MEMOIZE", K_MEMOIZE, A_NONE, 0);
  def(0x95, "FRAME", K_FRAME, A_FIX, 8);        def(0x96, "BYTEARRAY8", K_PUSH, A_LEN8, 0);
  def(0x97, "NEXT_BUFFER", K_REFUSE, A_NONE, 0); def(0x98, "READONLY_BUFFER", K_REFUSE, A_NONE, 0);
  ops_ready = 1;
}


static inline uint64_t rd_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* ================= values ================= */

/* V_DONE: the place of a segment that was summarized and freed as soon as it was complete */
/* V_SITE: in the memo, a traceback reduced to its call site's id (u.i's low 32 bits), its frame count (the high
   32 bits: what each later use spends) and phase (len) (see site_of) */
enum { V_NONE, V_BOOL, V_INT, V_BIG, V_FLOAT, V_STR, V_RAWSTR, V_BYTES, V_OBJ, V_DONE, V_SITE };
enum { N_LIST, N_TUPLE, N_DICT, N_SET, N_FROZENSET };
/* what happens to what is appended to a list: kept, or summarized and freed */
enum { S_NONE, S_SEG, S_DT, S_TRACE, S_DROP };
/* a frame dict's class, cached on it: not yet known, the user's, a library .py file, neither */
enum { F_UNKNOWN, F_USER, F_PY, F_SKIP };
#define SITE_NONE (-1)
/* the phase a traceback's frames mark, as snapshot.py's PHASES names them (the innermost frame that marks one) */
enum { PH_OTHER, PH_PARAMETERS, PH_GRADIENTS, PH_OPTIMIZER, PH_ACTIVATIONS, PH_COUNT };

typedef struct node node_t;
/* V_STR: UTF-8 text in the mapped file; V_RAWSTR: protocol 0's raw-unicode-escape text, decoded when shown */
typedef struct { uint8_t t; uint32_t len; union { int64_t i; double f; const uint8_t *s; node_t *n; } u; } val_t;

struct node {
  uint32_t refs;
  uint8_t kind, stream, fclass, cut;  /* cut: a traceback reduced to its cached site (see site_of) */
  uint8_t busy;                       /* a list the summary is walking: never cut while walked */
  uint8_t hint;                       /* a frame dict: the phase its function marks (PH_*), cached with fclass;
                                         a traceback list: its phase, cached with site */
  uint8_t keep;                       /* a streamed list referred to again: its items are kept as well */
  uint8_t summarized;                 /* a streamed list: what it was given is summarized already */
  uint8_t placed;                     /* a streamed trace: appended in its place in device_traces (counted) */
  uint8_t lost;                       /* a streamed list: items were summarized and let go, so it is not whole */
  uint32_t walked;                    /* a traceback: the frames its cached site was found among (spent again
                                         at each use, as snapshot.py's _facts spends them) */
  int32_t site;                       /* cached call site of a frame dict or a traceback list */
  uint32_t n, cap;                    /* items (pairs for a dict) */
  int64_t aux;                        /* S_DT: elements taken; S_TRACE: its device index */
  uint32_t memo_slot;                 /* 1 + its place in memo_vals, when the memo holds it; else 0 */
  val_t *items;
  node_t *next_free;
};

/* ================= the context ================= */

#define POOL_CLASSES 9  /* item arrays of 4 to 1024 values come from per-size free lists */

typedef struct { size_t start; uint8_t is_list; } slot_t;
typedef struct { size_t sp, off; } mark_t;
typedef struct { size_t start, end; uint8_t is_list; } child_t;
typedef struct { size_t child, parent; } pair_t;
#define TL_POINTS 256 /* snapshot.py's TIMELINE_POINTS */
typedef struct { uint64_t hash; uint32_t off, len; acc_t bytes; int64_t order; } site_t;
typedef struct { int64_t size; int32_t site; } big_t;
typedef struct { int64_t device, bytes_kind, bytes, site, free_kind, free; } oom_t;

typedef struct {
  const uint8_t *buf; size_t len;
  int err; size_t err_off; char msg[240];
  size_t dropped;
  /* memo (both passes) */
  uint64_t *fetched, *again, *defined; uint32_t *rank; size_t words; uint64_t n_memo, n_fetched; int memo_style;
  /* pass 1 */
  slot_t *st; size_t sp, cap_st; mark_t *marks; size_t nm, cap_m;
  child_t *rc; size_t n_rc, cap_rc; pair_t *ll; size_t n_ll, cap_ll; int root_ok;
  pair_t *l2; size_t n_l2, cap_l2;
  pair_t *se; size_t n_se, cap_se;  /* (end, parent start) of each element of a list that may be a root value */
  size_t pos1; uint64_t memo1; int scanned;
  /* pass 2 */
  val_t *vs; size_t vsp, cap_vs; size_t *vmarks; size_t vnm, cap_vm;
  val_t *memo_vals; size_t pos2; uint64_t memo2; int done;
  size_t rc_i, l2_i; size_t dt_slot, dt_start; int has_dt;
  size_t se_i, se_end, seg_slot, seg_start; int has_seg;
  node_t *free_nodes; node_t **fq; size_t cap_fq;
  void *pool[POOL_CLASSES];  /* freed item arrays of 4 << k values, reused before malloc is asked */
  uint64_t live_nodes, peak_nodes, made_nodes, released, n_ops, streamed_segments, streamed_events, kept_lists;
  /* the caller's rule for a file name (UTF-8): 1 when it is the user's code */
  /* the caller's rule for a frame (file name and function name, UTF-8): bit 0 set when the file is the
     user's code, bits 1-3 the phase the function marks (PH_*) */
  int (*frame_code)(const char *file, size_t file_len, const char *name, size_t name_len);
  /* the summary */
  int64_t segments, blocks, largest_free;
  acc_t reserved, allocated, requested, free_bytes;
  int64_t trace_events, trace_peak_at;
  acc_t live, trace_peak;
  /* snapshot.py's timeline: the most live (and reserved) bytes over each `tl_stride` events, TL_POINTS at most */
  int64_t segment_events, tl_n, tl_stride, tl_fill;
  acc_t reserved_live, tl_alloc[TL_POINTS], tl_res[TL_POINTS], tl_a, tl_r;
  acc_t phase_bytes[PH_COUNT];
  site_t *sites; size_t n_sites, cap_sites; uint32_t *table; size_t table_cap; int64_t site_order;
  char *arena; size_t arena_n, arena_cap;
  big_t largest[10]; int n_largest;
  oom_t ooms[5]; int n_ooms;
  char *tmp; size_t tmp_cap;
  int32_t site_no_frames, site_no_py;
  /* what the summary walked (segments, blocks, trace events, frames), the most it may (0: no limit; beyond it
     E_WORK: a memo bomb names one segment 10^5 x 10^5 times for two bytes a reference), and how much one
     ts_eval call may walk before it returns to the caller (which can then see a Ctrl-C) */
  uint64_t work, budget, work_slice;
} ctx_t;

static int fail(ctx_t *c, int code, size_t off, const char *msg) {
  if (!c->err) { c->err = code; c->err_off = off; snprintf(c->msg, sizeof c->msg, "%s", msg); }
  return -1;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t n = *cap ? *cap : 64;
  while (n < need) n *= 2;
  void *q = realloc(*p, n * elem);
  if (!q) return -1;
  *p = q; *cap = n;
  return 0;
}

/* Item arrays: capacity 4 << k values, k < POOL_CLASSES, kept on a free list per k when freed, so the
   millions of small dicts and lists a snapshot holds cost no malloc after the first segments. */
static val_t *items_alloc(ctx_t *c, size_t need, uint32_t *cap) {
  int k = 0;
  size_t n = 4;
  while (n < need && k < POOL_CLASSES) { n <<= 1; k++; }
  if (k == POOL_CLASSES) {  /* larger than the pools: malloc, rounded up to a power of two */
    while (n < need) n <<= 1;
    *cap = (uint32_t)n;
    return malloc(n * sizeof(val_t));
  }
  *cap = (uint32_t)n;
  void *p = c->pool[k];
  if (p) { c->pool[k] = *(void **)p; return p; }
  return malloc(n * sizeof(val_t));
}

static void items_free(ctx_t *c, val_t *items, uint32_t cap) {
  if (!items) return;
  int k = 0;
  size_t n = 4;
  while (n < cap && k < POOL_CLASSES) { n <<= 1; k++; }
  if (k == POOL_CLASSES || n != cap) { free(items); return; }
  *(void **)items = c->pool[k];
  c->pool[k] = items;
}

/* Drop the file's pages more than `lag` bytes behind the cursor. Pass 2 keeps a window: the values of the
   batch being built (the pickler appends 1000 segments at a time) point at strings in it, and a page
   dropped under them would be faulted back when they are summarized, and then stay. */
static void drop_behind(ctx_t *c, size_t pos, size_t lag) {
  if (pos < lag) return;
  size_t upto = (pos - lag) & ~(size_t)4095;
  if (upto >= c->dropped + ((size_t)32 << 20)) {
    madvise((void *)(c->buf + c->dropped), upto - c->dropped, MADV_DONTNEED);
    c->dropped = upto;
  }
}

/* ================= memo bitmaps ================= */

static int memo_room(ctx_t *c, uint64_t key) {
  size_t need = (size_t)(key >> 6) + 1;
  if (need <= c->words) return 0;
  if (key > (uint64_t)c->len * 2 + 4096) return -1;  /* no valid pickle of this size has that key */
  size_t n = c->words ? c->words : 1024;
  while (n < need) n *= 2;
  uint64_t **maps[3] = {&c->fetched, &c->defined, &c->again};
  for (int i = 0; i < 3; i++) {
    uint64_t *m = realloc(*maps[i], n * 8);
    if (!m) return -1;
    memset(m + c->words, 0, (n - c->words) * 8);
    *maps[i] = m;
  }
  c->words = n;
  return 0;
}

static inline int bit(const uint64_t *m, size_t words, uint64_t k) {
  return (k >> 6) < words && (m[k >> 6] >> (k & 63)) & 1;
}

/* bits set in x, without needing the popcnt instruction (the library is compiled for any x86-64 or arm64) */
static inline uint64_t ones(uint64_t x) {
  x = x - ((x >> 1) & 0x5555555555555555ULL);
  x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
  return (x * 0x0101010101010101ULL) >> 56;
}

/* the dense index of a fetched key among all fetched keys */
static inline uint64_t rank_of(const ctx_t *c, uint64_t key) {
  return c->rank[key >> 6] + (uint64_t)ones(c->fetched[key >> 6] & (((uint64_t)1 << (key & 63)) - 1));
}

/* ================= decoding ================= */

typedef struct { int code; size_t size; uint64_t key; } op_t;

/* Decode the opcode at pos: its total size and, for memo opcodes, the key. */
static inline int decode(ctx_t *c, size_t pos, op_t *op) {
  const uint8_t *b = c->buf;
  size_t end = c->len;
  int code = b[pos];
  opinfo_t in = OPS[code];
  op->code = code;
  op->key = 0;
  size_t p = pos + 1, n = 0;
  switch (in.arg) {
    case A_NONE:
      if (in.kind == K_UNKNOWN) {
        char m[80];
        snprintf(m, sizeof m, "byte 0x%02x is not a pickle opcode", code);
        return fail(c, E_NOTPICKLE, pos, m);
      }
      break;
    case A_FIX:
      n = in.n;
      if (p + n > end) return fail(c, E_TRUNCATED, pos, "the file ends inside an opcode");
      if (in.kind == K_GET || in.kind == K_PUT) op->key = rd_le(b + p, in.n);
      break;
    case A_LINE: {
      const uint8_t *nl = p < end ? memchr(b + p, '\n', end - p) : NULL;
      if (!nl) return fail(c, E_TRUNCATED, pos, "the file ends inside an opcode");
      n = (size_t)(nl - (b + p)) + 1;
      if (in.kind == K_GET || in.kind == K_PUT) {
        uint64_t k = 0;
        for (size_t i = p; i < p + n - 1; i++) {
          if (b[i] < '0' || b[i] > '9') return fail(c, E_NOTPICKLE, pos, "a memo key is not a number");
          k = k * 10 + (uint64_t)(b[i] - '0');
          if (k > ((uint64_t)1 << 40)) return fail(c, E_NOTPICKLE, pos, "a memo key is out of range");
        }
        op->key = k;
      }
      break;
    }
    default: {
      int w = in.arg == A_LEN1 ? 1 : in.arg == A_LEN4 ? 4 : 8;
      if (p + (size_t)w > end) return fail(c, E_TRUNCATED, pos, "the file ends inside an opcode");
      uint64_t l = rd_le(b + p, w);
      if (l > end) return fail(c, E_TRUNCATED, pos, "the file ends inside an opcode");
      n = (size_t)w + (size_t)l;
      if (p + n > end) return fail(c, E_TRUNCATED, pos, "the file ends inside an opcode");
    }
  }
  op->size = 1 + n;
  return 0;
}

/* ================= pass 1: refuse, count fetches, find the skeleton ================= */

static int underflow(ctx_t *c, size_t pos) { return fail(c, E_NOTPICKLE, pos, "the opcodes take more from the stack than it holds"); }

static int push1(ctx_t *c, size_t start, uint8_t is_list) {
  if (c->sp == c->cap_st && grow((void **)&c->st, &c->cap_st, c->sp + 1, sizeof(slot_t)))
    return fail(c, E_NOMEM, start, "out of memory");
  c->st[c->sp].start = start; c->st[c->sp].is_list = is_list;
  c->sp++;
  return 0;
}

static int pop_mark1(ctx_t *c, size_t pos, mark_t *out) {
  if (!c->nm) return underflow(c, pos);
  *out = c->marks[--c->nm];
  if (out->sp > c->sp) return underflow(c, pos);
  return 0;
}

/* an opcode other than SETITEM(S) that takes the root off the stack: the root is not a dict to stream */
static inline void taken1(ctx_t *c, size_t from) { if (from == 0) c->root_ok = 0; }

/* APPEND(S)/SETITEM(S): the root's children (by byte range) and the lists appended to lists */
static int consume1(ctx_t *c, size_t parent, size_t first, size_t last, size_t op_off) {
  if (parent == 0 && (c->buf[op_off] == 'a' || c->buf[op_off] == 'e' || ((last - first) & 1))) c->root_ok = 0;
  if (parent == 0 && c->root_ok) {
    for (size_t i = first; i < last; i++) {
      if (grow((void **)&c->rc, &c->cap_rc, c->n_rc + 1, sizeof(child_t))) return fail(c, E_NOMEM, op_off, "out of memory");
      child_t *ch = &c->rc[c->n_rc++];
      ch->start = c->st[i].start;
      ch->end = i + 1 < last ? c->st[i + 1].start : op_off;
      ch->is_list = c->st[i].is_list && c->buf[ch->start] == ']';
      if (c->n_rc > 4096) { c->root_ok = 0; return 0; }
    }
  } else if (c->st[parent].is_list) {
    /* the elements of a list in a root value's place (the root's mark below, nothing else): where each ends,
       so pass 2 can summarize a segment as soon as it is complete, while it is still in the cache */
    if (c->root_ok && parent >= 2 && !(parent & 1) && (c->nm == 0 || (c->nm == 1 && c->marks[0].sp == 1)) &&
        c->buf[c->st[parent].start] == ']') {
      for (size_t i = first; i < last; i++) {
        if (grow((void **)&c->se, &c->cap_se, c->n_se + 1, sizeof(pair_t))) return fail(c, E_NOMEM, op_off, "out of memory");
        c->se[c->n_se].child = i + 1 < last ? c->st[i + 1].start : op_off;
        c->se[c->n_se].parent = c->st[parent].start;
        c->n_se++;
      }
    }
    for (size_t i = first; i < last; i++) {
      if (!(c->st[i].is_list && c->buf[c->st[i].start] == ']')) continue;
      if (grow((void **)&c->ll, &c->cap_ll, c->n_ll + 1, sizeof(pair_t))) return fail(c, E_NOMEM, op_off, "out of memory");
      c->ll[c->n_ll].child = c->st[i].start;
      c->ll[c->n_ll].parent = c->st[parent].start;
      c->n_ll++;
    }
  }
  return 0;
}

/* One opcode of pass 1: 1 at STOP, 0 to go on, -1 on error. */
static int step1(ctx_t *c, size_t pos, op_t *op) {
  if (decode(c, pos, op)) return -1;
  opinfo_t in = OPS[op->code];
  mark_t mk;
  c->n_ops++;
  switch (in.kind) {
    case K_REFUSE: return fail(c, E_REFUSED, pos, NAMES[op->code]);
    case K_FRAME: break;
    case K_NONE:
      if (op->code == 0x85) {  /* TUPLE1 */
        if (!c->sp) return underflow(c, pos);
        taken1(c, c->sp - 1);
        c->st[c->sp - 1].is_list = 0;
      }
      break;
    case K_PUSH:
      if (c->sp == 0 && op->code != '}') c->root_ok = 0;
      if (push1(c, pos, op->code == ']')) return -1;
      break;
    case K_GET: {
      if (!bit(c->defined, c->words, op->key)) return fail(c, E_NOTPICKLE, pos, "a memo key is fetched before it is stored");
      uint64_t m = (uint64_t)1 << (op->key & 63);
      if (c->fetched[op->key >> 6] & m) c->again[op->key >> 6] |= m;
      c->fetched[op->key >> 6] |= m;
      if (push1(c, pos, 0)) return -1;
      break;
    }
    case K_MEMOIZE: case K_PUT: {
      if (!c->sp) return underflow(c, pos);
      int style = in.kind == K_MEMOIZE ? 1 : 2;
      if (c->memo_style && c->memo_style != style) return fail(c, E_SHAPE, pos, "mixed memo styles");
      c->memo_style = style;
      uint64_t key = in.kind == K_MEMOIZE ? c->memo1++ : op->key;
      if (memo_room(c, key)) return fail(c, E_NOTPICKLE, pos, "a memo key is out of range");
      c->defined[key >> 6] |= (uint64_t)1 << (key & 63);
      break;
    }
    case K_MARK:
      if (c->nm == c->cap_m && grow((void **)&c->marks, &c->cap_m, c->nm + 1, sizeof(mark_t)))
        return fail(c, E_NOMEM, pos, "out of memory");
      c->marks[c->nm].sp = c->sp; c->marks[c->nm].off = pos;
      c->nm++;
      break;
    case K_STOP:
      if (c->sp != 1) return fail(c, E_NOTPICKLE, pos, "the pickle stops with other than one object built");
      return 1;
    case K_POP:
      if (!c->sp) return underflow(c, pos);
      taken1(c, c->sp - 1);
      c->sp--;
      break;
    case K_POPMARK:
      if (pop_mark1(c, pos, &mk)) return -1;
      taken1(c, mk.sp);
      c->sp = mk.sp;
      break;
    case K_APPEND: case K_SETITEM: {
      size_t k = in.kind == K_APPEND ? 1 : 2;
      if (c->sp < k + 1) return underflow(c, pos);
      size_t parent = c->sp - k - 1;
      if (consume1(c, parent, parent + 1, c->sp, pos)) return -1;
      c->sp = parent + 1;
      break;
    }
    case K_APPENDS: case K_SETITEMS: case K_ADDITEMS:
      if (pop_mark1(c, pos, &mk)) return -1;
      if (mk.sp == 0) return underflow(c, pos);
      if (in.kind != K_ADDITEMS && consume1(c, mk.sp - 1, mk.sp, c->sp, pos)) return -1;
      if (in.kind == K_ADDITEMS) taken1(c, mk.sp - 1);
      c->sp = mk.sp;
      break;
    case K_FROMMARK:
      if (pop_mark1(c, pos, &mk)) return -1;
      taken1(c, mk.sp);
      c->sp = mk.sp;
      if (c->sp == 0) c->root_ok = 0;  /* a root built from a mark (protocol 0): not streamed */
      if (push1(c, mk.off, 0)) return -1;
      break;
    case K_TUPLE2: case K_TUPLE3: {
      size_t k = in.kind == K_TUPLE2 ? 2 : 3;
      if (c->sp < k) return underflow(c, pos);
      taken1(c, c->sp - k);
      c->sp -= k - 1;
      c->st[c->sp - 1].is_list = 0;
      break;
    }
    default: break;
  }
  return 0;
}

/* ================= pass 2: nodes ================= */

static node_t *new_node(ctx_t *c, uint8_t kind) {
  node_t *n = c->free_nodes;
  if (n) c->free_nodes = n->next_free;
  else if (!(n = malloc(sizeof(node_t)))) return NULL;
  memset(n, 0, sizeof *n);
  n->refs = 1; n->kind = kind; n->site = SITE_NONE;
  c->live_nodes++; c->made_nodes++;
  if (c->live_nodes > c->peak_nodes) c->peak_nodes = c->live_nodes;
  return n;
}

static inline size_t n_vals(const node_t *n) { return n->kind == N_DICT ? 2 * (size_t)n->n : n->n; }

/* Drop one reference; a node nobody holds frees what it holds, without recursion (a deep pickle is fine). */
static void unref(ctx_t *c, node_t *n) {
  if (--n->refs) return;
  size_t q = 0;
  if (!c->cap_fq && grow((void **)&c->fq, &c->cap_fq, 64, sizeof(node_t *))) { c->fq = NULL; return; }
  c->fq[q++] = n;
  while (q) {
    node_t *x = c->fq[--q];
    size_t nv = n_vals(x);
    for (size_t i = 0; i < nv; i++) {
      if (x->items[i].t != V_OBJ) continue;
      node_t *y = x->items[i].u.n;
      if (--y->refs) continue;
      if (q == c->cap_fq && grow((void **)&c->fq, &c->cap_fq, q + 1, sizeof(node_t *))) continue; /* leak, no crash */
      c->fq[q++] = y;
    }
    items_free(c, x->items, x->cap);
    x->next_free = c->free_nodes;
    c->free_nodes = x;
    c->live_nodes--;
  }
}

static inline void release(ctx_t *c, val_t v) { if (v.t == V_OBJ) unref(c, v.u.n); }
static inline val_t share(val_t v) { if (v.t == V_OBJ) v.u.n->refs++; return v; }

/* append n values to a node (moved: the node now holds their references) */
static int add_items(ctx_t *c, node_t *n, const val_t *v, size_t count, size_t pos) {
  size_t have = n_vals(n);
  if (have + count > n->cap) {
    uint32_t cap;
    val_t *items = items_alloc(c, have + count, &cap);
    if (!items) return fail(c, E_NOMEM, pos, "out of memory");
    if (have) memcpy(items, n->items, have * sizeof(val_t));
    items_free(c, n->items, n->cap);
    n->items = items; n->cap = cap;
  }
  memcpy(n->items + have, v, count * sizeof(val_t));
  n->n += (uint32_t)(n->kind == N_DICT ? count / 2 : count);
  return 0;
}

static int vpush(ctx_t *c, val_t v, size_t pos) {
  if (c->vsp == c->cap_vs && grow((void **)&c->vs, &c->cap_vs, c->vsp + 1, sizeof(val_t))) {
    release(c, v);
    return fail(c, E_NOMEM, pos, "out of memory");
  }
  c->vs[c->vsp++] = v;
  return 0;
}

/* a node of `kind` made of the top `count` values */
static int collect(ctx_t *c, uint8_t kind, size_t count, size_t pos) {
  node_t *n = new_node(c, kind);
  if (!n) return fail(c, E_NOMEM, pos, "out of memory");
  if (count && add_items(c, n, c->vs + c->vsp - count, count, pos)) { unref(c, n); return -1; }
  c->vsp -= count;
  val_t v = {.t = V_OBJ};
  v.u.n = n;
  return vpush(c, v, pos);
}

/* ================= the summary ================= */

static inline int str_is(const val_t *v, const char *lit, uint32_t n) {
  return v && (v->t == V_STR || v->t == V_RAWSTR) && v->len == n && memcmp(v->u.s, lit, n) == 0;
}
#define STR_IS(v, lit) str_is((v), lit, (uint32_t)(sizeof lit - 1))

static inline int is_node(const val_t *v, uint8_t kind) { return v && v->t == V_OBJ && v->u.n->kind == kind; }

/* d[key] (the last one set wins, as in a Python dict), or NULL */
static const val_t *dget(const node_t *d, const char *key, uint32_t n) {
  for (size_t i = d->n; i-- > 0;) {
    const val_t *k = &d->items[2 * i];
    if ((k->t == V_STR || k->t == V_RAWSTR) && k->len == n && memcmp(k->u.s, key, n) == 0) return &d->items[2 * i + 1];
  }
  return NULL;
}
#define DGET(d, lit) dget((d), lit, (uint32_t)(sizeof lit - 1))

/* how many times d sets key */
static size_t key_count(const node_t *d, const char *key, uint32_t n) {
  size_t k = 0;
  for (size_t i = 0; i < d->n; i++) {
    const val_t *v = &d->items[2 * i];
    if ((v->t == V_STR || v->t == V_RAWSTR) && v->len == n && memcmp(v->u.s, key, n) == 0) k++;
  }
  return k;
}

/* snapshot.py's _int: ints and booleans as they are, floats truncated, anything else 0 */
static inline int64_t as_int(const val_t *v) {
  if (!v) return 0;
  if (v->t == V_INT) return v->u.i == INT64_MIN ? 0 : v->u.i;  /* snapshot.py's range: |v| < 2^63 */
  if (v->t == V_BOOL) return v->u.i;
  if (v->t == V_FLOAT) return v->u.f < 9.2e18 && v->u.f > -9.2e18 ? (int64_t)v->u.f : 0;  /* NaN, inf: 0 */
  return 0;
}

static char *tmp_room(ctx_t *c, size_t n) {
  if (grow((void **)&c->tmp, &c->tmp_cap, n, 1)) return NULL;
  return c->tmp;
}

static void put_utf8(char *out, size_t *o, uint32_t cp) {
  if (cp < 0x80) out[(*o)++] = (char)cp;
  else if (cp < 0x800) { out[(*o)++] = (char)(0xc0 | cp >> 6); out[(*o)++] = (char)(0x80 | (cp & 63)); }
  else if (cp < 0x10000) {
    out[(*o)++] = (char)(0xe0 | cp >> 12); out[(*o)++] = (char)(0x80 | ((cp >> 6) & 63)); out[(*o)++] = (char)(0x80 | (cp & 63));
  } else {
    out[(*o)++] = (char)(0xf0 | cp >> 18); out[(*o)++] = (char)(0x80 | ((cp >> 12) & 63));
    out[(*o)++] = (char)(0x80 | ((cp >> 6) & 63)); out[(*o)++] = (char)(0x80 | (cp & 63));
  }
}

static int hexval(uint8_t ch) {
  return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* Text of a string value as UTF-8 into out (room for 4 bytes per input byte); returns its length. */
static size_t text_of(const val_t *v, char *out) {
  if (v->t == V_STR) { memcpy(out, v->u.s, v->len); return v->len; }
  /* raw-unicode-escape: \uXXXX and \UXXXXXXXX are code points, every other byte is latin-1 */
  size_t o = 0;
  const uint8_t *s = v->u.s;
  for (size_t i = 0; i < v->len; i++) {
    int w = 0;
    if (s[i] == '\\' && i + 1 < v->len) w = s[i + 1] == 'u' ? 4 : s[i + 1] == 'U' ? 8 : 0;
    if (w && i + 1 + (size_t)w < v->len) {
      uint32_t cp = 0;
      int ok = 1;
      for (int k = 0; k < w; k++) { int h = hexval(s[i + 2 + k]); if (h < 0) { ok = 0; break; } cp = cp * 16 + (uint32_t)h; }
      if (ok && cp < 0x110000) { put_utf8(out, &o, cp); i += 1 + (size_t)w; continue; }
    }
    put_utf8(out, &o, s[i]);
  }
  return o;
}

/* Python's str() of a frame's line value, appended at out; returns the length */
static size_t line_text(const val_t *v, char *out) {
  if (!v || v->t == V_NONE) { memcpy(out, "None", 4); return 4; }
  if (v->t == V_BOOL) { const char *s = v->u.i ? "True" : "False"; memcpy(out, s, strlen(s)); return strlen(s); }
  if (v->t == V_INT && v->u.i != INT64_MIN) return (size_t)sprintf(out, "%lld", (long long)v->u.i);
  if (v->t == V_FLOAT && v->u.f != v->u.f) { memcpy(out, "nan", 3); return 3; }  /* whatever its sign bit */
  if (v->t == V_FLOAT) {
    /* the shortest %g text that reads back as the same double (snapshot_frames.line_text's rule) */
    for (int p = 1; p <= 17; p++) {
      int n = sprintf(out, "%.*g", p, v->u.f);
      if (strtod(out, NULL) == v->u.f || p == 17) {
        if (!strpbrk(out, ".eni")) { memcpy(out + n, ".0", 2); n += 2; }
        return (size_t)n;
      }
    }
  }
  if (v->t == V_STR || v->t == V_RAWSTR) return text_of(v, out);
  memcpy(out, "?", 1);
  return 1;
}

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) { h ^= (uint8_t)s[i]; h *= 1099511628211ULL; }
  return h;
}

/* The id of a site's text, interned. */
static int32_t intern(ctx_t *c, const char *s, size_t n) {
  uint64_t h = hash_bytes(s, n);
  if (c->n_sites * 2 >= c->table_cap) {  /* rehash at half full */
    size_t cap = c->table_cap ? c->table_cap * 2 : 1024;
    uint32_t *t = malloc(cap * sizeof(uint32_t));
    if (!t) { fail(c, E_NOMEM, 0, "out of memory"); return SITE_NONE; }
    memset(t, 0xff, cap * sizeof(uint32_t));
    for (size_t i = 0; i < c->n_sites; i++) {
      size_t j = c->sites[i].hash & (cap - 1);
      while (t[j] != 0xffffffffu) j = (j + 1) & (cap - 1);
      t[j] = (uint32_t)i;
    }
    free(c->table);
    c->table = t; c->table_cap = cap;
  }
  size_t j = h & (c->table_cap - 1);
  while (c->table[j] != 0xffffffffu) {
    site_t *e = &c->sites[c->table[j]];
    if (e->hash == h && e->len == n && memcmp(c->arena + e->off, s, n) == 0) return (int32_t)c->table[j];
    j = (j + 1) & (c->table_cap - 1);
  }
  if (grow((void **)&c->sites, &c->cap_sites, c->n_sites + 1, sizeof(site_t)) ||
      grow((void **)&c->arena, &c->arena_cap, c->arena_n + n + 1, 1)) {
    fail(c, E_NOMEM, 0, "out of memory");
    return SITE_NONE;
  }
  site_t *e = &c->sites[c->n_sites];
  e->hash = h; e->off = (uint32_t)c->arena_n; e->len = (uint32_t)n; e->bytes = 0; e->order = -1;
  memcpy(c->arena + c->arena_n, s, n);
  c->arena[c->arena_n + n] = 0;
  c->arena_n += n + 1;
  c->table[j] = (uint32_t)c->n_sites;
  return (int32_t)c->n_sites++;
}

/* Count `units` of the summary's walk; nonzero (and E_WORK) once the budget is spent. */
static int spend(ctx_t *c, uint64_t units) {
  c->work += units;
  if (c->budget && c->work > c->budget && !c->err)
    return fail(c, E_WORK, c->scanned ? c->pos2 : c->pos1, "more blocks, frames and events than the file's size allows");
  return c->err;
}

/* A frame dict's class, the phase it marks (any frame: C++ frames name the autograd engine) and, for a
   .py file, its site "file:line" (cached on the dict). Whose file it is and what phase its function marks the caller decides (snapshot_frames.frame_code),
   once per distinct (file, function): the pair is interned with a leading \1 (never a site's first
   byte), and that entry's `bytes` holds 1 + the caller's answer. */
static uint8_t frame_class(ctx_t *c, node_t *f) {
  if (f->fclass != F_UNKNOWN) return f->fclass;
  f->hint = PH_OTHER;
  const val_t *fn = DGET(f, "filename");
  if (!fn || (fn->t != V_STR && fn->t != V_RAWSTR)) return f->fclass = F_SKIP;  /* missing: "" is not a .py file */
  const val_t *line = DGET(f, "line"), *name = DGET(f, "name");
  if (name && name->t != V_STR && name->t != V_RAWSTR) name = NULL;
  size_t room = (size_t)fn->len * 4 + (name ? name->len * 4 : 0) +
                (line && (line->t == V_STR || line->t == V_RAWSTR) ? line->len * 4 : 0) + 64;
  char *out = tmp_room(c, room);
  if (!out) return F_SKIP;
  size_t n = text_of(fn, out + 1);
  int is_py = n >= 3 && memcmp(out + 1 + n - 3, ".py", 3) == 0;  /* only a .py frame can be a call site */
  out[0] = 1;
  out[1 + n] = 0;
  size_t nn = name ? text_of(name, out + 2 + n) : 0;
  int32_t key = intern(c, out, n + 2 + nn);
  if (key < 0) return F_SKIP;
  if (c->sites[key].bytes == 0)
    c->sites[key].bytes = 1 + (c->frame_code ? (c->frame_code(out + 1, n, out + 2 + n, nn) & 15) : 0);
  int code = (int)c->sites[key].bytes - 1;
  f->hint = (uint8_t)((code >> 1) < PH_COUNT ? code >> 1 : PH_OTHER);
  if (!is_py) return f->fclass = F_SKIP;
  uint8_t cls = code & 1 ? F_USER : F_PY;
  out[1 + n] = ':';
  size_t len = n + 1 + line_text(line, out + 2 + n);
  f->site = intern(c, out + 1, len);
  return f->fclass = cls;
}

/* snapshot.py's traceback_facts: the site (the innermost user frame, else the first .py frame, else a
   placeholder) and the phase (the innermost frame that marks one), cached on the traceback list. A
   traceback something else still holds (the memo, for a trace event later in the file) is cut down to
   these two: the summary never needs its frames again, and the memo would otherwise keep a list per live
   block until the end of the file. */
static int32_t site_of(ctx_t *c, const val_t *frames, uint8_t *phase) {
  *phase = PH_OTHER;
  /* every use spends the traceback's frames, cached or not: a memo that names one long traceback from
     every block is walked (and counted) as often as the Python reader walks it */
  if (frames && frames->t == V_SITE) {
    if (spend(c, (uint64_t)frames->u.i >> 32)) return c->site_no_frames;
    *phase = (uint8_t)frames->len;
    return (int32_t)(uint32_t)((uint64_t)frames->u.i & 0xffffffffu);
  }
  if (!is_node(frames, N_LIST)) return c->site_no_frames;
  node_t *l = frames->u.n;
  if (l->site != SITE_NONE || l->cut) {
    if (spend(c, l->walked)) return c->site_no_frames;
    *phase = l->hint;
    return l->site;
  }
  int32_t fallback = SITE_NONE, site = SITE_NONE;
  uint8_t hint = PH_OTHER;
  if (spend(c, l->n)) return c->site_no_frames;
  l->walked = l->n;
  for (size_t i = 0; i < l->n && (site == SITE_NONE || hint == PH_OTHER); i++) {
    if (!is_node(&l->items[i], N_DICT)) continue;
    node_t *f = l->items[i].u.n;
    uint8_t cls = frame_class(c, f);
    if (hint == PH_OTHER) hint = f->hint;
    if (cls == F_USER && site == SITE_NONE) site = f->site;
    if (cls == F_PY && fallback == SITE_NONE) fallback = f->site;
  }
  if (site == SITE_NONE) site = fallback != SITE_NONE ? fallback : c->site_no_py;
  l->site = site;
  l->hint = hint;
  *phase = hint;
  if (l->refs > 1 && !l->busy) {
    for (size_t i = 0; i < l->n; i++) release(c, l->items[i]);
    items_free(c, l->items, l->cap);
    l->items = NULL; l->n = l->cap = 0; l->cut = 1;
    if (l->memo_slot) {  /* the memo keeps the two facts alone, and the list goes with the block that holds it */
      val_t *m = &c->memo_vals[l->memo_slot - 1];
      l->memo_slot = 0;
      if (m->t == V_OBJ && m->u.n == l) {
        m->t = V_SITE;
        m->u.i = (int64_t)((uint64_t)(uint32_t)site | ((uint64_t)l->walked << 32));
        m->len = hint;
        unref(c, l);
      }
    }
  }
  return site;
}

static void add_site_bytes(ctx_t *c, int32_t site, int64_t size) {
  if (site < 0) return;
  site_t *e = &c->sites[site];
  if (e->order < 0) e->order = c->site_order++;
  e->bytes += size;
}

/* keep the ten largest, earlier ones first among equals (snapshot.py: append, stable sort, cut) */
static void note_largest(ctx_t *c, int64_t size, int32_t site) {
  if (c->n_largest >= 10 && size <= c->largest[9].size) return;
  int i = c->n_largest < 10 ? c->n_largest++ : 9;
  while (i > 0 && c->largest[i - 1].size < size) { c->largest[i] = c->largest[i - 1]; i--; }
  c->largest[i].size = size; c->largest[i].site = site;
}

/* snapshot.py's SnapshotSummary.segment */
static void summarize_segment(ctx_t *c, const val_t *seg) {
  c->segments++;
  if (!is_node(seg, N_DICT)) return;
  node_t *s = seg->u.n;
  c->reserved += as_int(DGET(s, "total_size"));
  const val_t *blocks = DGET(s, "blocks");
  if (!is_node(blocks, N_LIST)) return;
  node_t *bl = blocks->u.n;
  if (spend(c, 1 + (uint64_t)bl->n)) return;
  bl->busy++;
  for (size_t i = 0; i < bl->n && !c->err; i++) {
    if (!is_node(&bl->items[i], N_DICT)) continue;
    node_t *b = bl->items[i].u.n;
    const val_t *state = DGET(b, "state");
    int64_t size = as_int(DGET(b, "size"));
    if (STR_IS(state, "active_allocated")) {
      c->blocks++;
      c->allocated += size;
      const val_t *req = DGET(b, "requested_size");
      c->requested += req ? as_int(req) : size;
      uint8_t phase;
      int32_t site = site_of(c, DGET(b, "frames"), &phase);
      add_site_bytes(c, site, size);
      c->phase_bytes[phase] += size;
      note_largest(c, size, site);
    } else if (STR_IS(state, "inactive")) {
      c->free_bytes += size;
      if (size > c->largest_free) c->largest_free = size;
    }
  }
  bl->busy--;
}

static void raw_number(const val_t *v, int64_t *kind, int64_t *out) {
  if (!v || v->t == V_NONE) { *kind = 0; *out = 0; }
  else if (v->t == V_INT && v->u.i != INT64_MIN) { *kind = 1; *out = v->u.i; }  /* snapshot.py's _raw */
  else if (v->t == V_BOOL) { *kind = 2; *out = v->u.i; }
  else if (v->t == V_FLOAT) { *kind = 3; memcpy(out, &v->u.f, 8); }
  else { *kind = 0; *out = 0; }
}

/* snapshot.py's SnapshotSummary._timeline_close: keep the open point; merge pairs when full */
static void timeline_close(ctx_t *c) {
  c->tl_alloc[c->tl_n] = c->tl_a;
  c->tl_res[c->tl_n] = c->tl_r;
  if (++c->tl_n == TL_POINTS) {
    for (int i = 0; i < TL_POINTS / 2; i++) {
      acc_t a = c->tl_alloc[2 * i], b = c->tl_alloc[2 * i + 1], r = c->tl_res[2 * i], q = c->tl_res[2 * i + 1];
      c->tl_alloc[i] = a > b ? a : b;
      c->tl_res[i] = r > q ? r : q;
    }
    c->tl_n = TL_POINTS / 2;
    c->tl_stride *= 2;
  }
  c->tl_fill = c->tl_stride;
  c->tl_a = c->tl_r = INT64_MIN;
}

/* snapshot.py's SnapshotSummary.trace_event */
static void summarize_event(ctx_t *c, int64_t device, const val_t *ev) {
  if (!is_node(ev, N_DICT)) return;
  node_t *e = ev->u.n;
  if (spend(c, 1)) return;
  c->trace_events++;
  const val_t *action = DGET(e, "action");
  if (STR_IS(action, "alloc")) {
    c->live += as_int(DGET(e, "size"));
    if (c->live > c->trace_peak) { c->trace_peak = c->live; c->trace_peak_at = c->trace_events - 1; }
  } else if (STR_IS(action, "free_completed")) {
    c->live -= as_int(DGET(e, "size"));
  } else if (STR_IS(action, "segment_alloc") || STR_IS(action, "segment_map")) {
    c->reserved_live += as_int(DGET(e, "size"));
    c->segment_events++;
  } else if (STR_IS(action, "segment_free") || STR_IS(action, "segment_unmap")) {
    c->reserved_live -= as_int(DGET(e, "size"));
    c->segment_events++;
  } else if (STR_IS(action, "oom")) {
    if (c->n_ooms == 5) { memmove(c->ooms, c->ooms + 1, 4 * sizeof(oom_t)); c->n_ooms--; }
    oom_t *o = &c->ooms[c->n_ooms++];
    o->device = device;
    raw_number(DGET(e, "size"), &o->bytes_kind, &o->bytes);
    uint8_t phase;
    o->site = site_of(c, DGET(e, "frames"), &phase);
    raw_number(DGET(e, "device_free"), &o->free_kind, &o->free);
  }
  if (c->live > c->tl_a) c->tl_a = c->live;
  if (c->reserved_live > c->tl_r) c->tl_r = c->reserved_live;
  if (--c->tl_fill == 0) timeline_close(c);
}

static void summarize_trace(ctx_t *c, int64_t device, const val_t *trace) {
  if (!is_node(trace, N_LIST)) return;
  node_t *t = trace->u.n;
  t->busy++;
  for (size_t i = 0; i < t->n && !c->err; i++) summarize_event(c, device, &t->items[i]);
  t->busy--;
}

/* ================= pass 2: the machine ================= */

static int bad_shape(ctx_t *c, size_t pos, const char *what) { return fail(c, E_NOTPICKLE, pos, what); }

/* An EMPTY_LIST at pos: is it a root value to stream, or a trace inside device_traces? */
static void tag_list(ctx_t *c, node_t *n, size_t pos) {
  while (c->rc_i < c->n_rc && c->rc[c->rc_i].start < pos) c->rc_i++;
  if (c->root_ok && c->rc_i < c->n_rc && c->rc[c->rc_i].start == pos && (c->rc_i & 1) && c->rc[c->rc_i].is_list &&
      c->vsp >= 2 && is_node(&c->vs[0], N_DICT)) {
    const val_t *key = &c->vs[c->vsp - 1];  /* the root's key is pushed right before its value */
    if ((STR_IS(key, "segments") && c->has_seg) || (STR_IS(key, "device_traces") && c->has_dt)) {
      fail(c, E_SHAPE, pos, "the root dict sets a key twice");  /* Python keeps the last: not streamed */
      return;
    }
    if (STR_IS(key, "segments")) {
      n->stream = S_SEG;
      n->summarized = 1;
      c->has_seg = 1; c->seg_slot = c->vsp; c->seg_start = pos;
    }
    else if (STR_IS(key, "device_traces")) {
      n->stream = S_DT;
      n->summarized = 1;
      c->has_dt = 1; c->dt_slot = c->vsp; c->dt_start = pos;
    } else n->stream = S_DROP;  /* the summary reads nothing else: its elements are freed as they come */
    return;
  }
  while (c->l2_i < c->n_l2 && c->l2[c->l2_i].child < pos) c->l2_i++;
  if (c->has_dt && c->l2_i < c->n_l2 && c->l2[c->l2_i].child == pos && c->l2[c->l2_i].parent == c->dt_start &&
      c->dt_slot < c->vsp && is_node(&c->vs[c->dt_slot], N_LIST) && c->vs[c->dt_slot].u.n->stream == S_DT) {
    n->stream = S_TRACE;
    n->summarized = 1;
    n->aux = c->vs[c->dt_slot].u.n->aux + (int64_t)(c->vsp - c->dt_slot - 1);
  }
}

/* values appended to a list: kept, or (a streamed list) summarized, then freed or (referred to again) kept */
static int take(ctx_t *c, node_t *list, size_t first, size_t pos) {
  size_t count = c->vsp - first;
  val_t *v = c->vs + first;
  switch (list->stream) {
    case S_SEG:
      for (size_t i = 0; i < count && !c->err; i++)
        if (v[i].t != V_DONE) { summarize_segment(c, &v[i]); c->streamed_segments++; }
      break;
    case S_DT:
      for (size_t i = 0; i < count && !c->err; i++, list->aux++) {
        if (v[i].t == V_DONE) continue;  /* summarized when it was complete (segment_done) */
        /* a trace streamed in this place was summarized as it was read; any other reference to a list (a memo
           fetch of that trace again, kept whole) is walked again, as the Python reader walks it */
        if (is_node(&v[i], N_LIST) && v[i].u.n->stream == S_TRACE && !v[i].u.n->placed) { v[i].u.n->placed = 1; continue; }
        summarize_trace(c, list->aux, &v[i]);
      }
      break;
    case S_TRACE:
      for (size_t i = 0; i < count && !c->err; i++) { summarize_event(c, list->aux, &v[i]); c->streamed_events++; }
      break;
    default: break;
  }
  if (list->stream == S_NONE || list->keep) {
    if (add_items(c, list, v, count, pos)) return -1;
    list->site = SITE_NONE;  /* a traceback that grows: its cached site is stale */
  } else {
    for (size_t i = 0; i < count; i++) release(c, v[i]);
    if (count) list->lost = 1;
  }
  c->vsp = first;
  return c->err ? -1 : 0;
}

static int vpop_mark(ctx_t *c, size_t pos, size_t *m) {
  if (!c->vnm) return underflow(c, pos);
  *m = c->vmarks[--c->vnm];
  if (*m > c->vsp) return underflow(c, pos);
  return 0;
}

static int parse_line_int(const uint8_t *s, size_t n, val_t *v) {
  size_t i = 0;
  int neg = 0;
  if (n && s[n - 1] == 'L') n--;  /* LONG's Python 2 suffix */
  if (i < n && (s[i] == '-' || s[i] == '+')) { neg = s[i] == '-'; i++; }
  if (i == n) return -1;
  uint64_t acc = 0;
  int big = 0;
  for (; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    if (acc > (UINT64_MAX - 9) / 10) big = 1;
    acc = acc * 10 + (uint64_t)(s[i] - '0');
  }
  if (big || acc > (uint64_t)INT64_MAX) { v->t = V_BIG; return 0; }
  v->t = V_INT; v->u.i = neg ? -(int64_t)acc : (int64_t)acc;
  return 0;
}

/* One opcode of pass 2: 1 at STOP, 0 to go on, -1 on error. Pass 1 has refused what is not plain data. */
static int step2(ctx_t *c, size_t pos, op_t *op) {
  if (decode(c, pos, op)) return -1;
  const uint8_t *a = c->buf + pos + 1;  /* the argument */
  opinfo_t in = OPS[op->code];
  val_t v = {.t = V_NONE};
  size_t m;
  switch (in.kind) {
    case K_REFUSE: return fail(c, E_REFUSED, pos, NAMES[op->code]);
    case K_FRAME: return 0;
    case K_NONE:
      if (op->code == 0x85) {  /* TUPLE1 */
        if (!c->vsp) return underflow(c, pos);
        return collect(c, N_TUPLE, 1, pos);
      }
      return 0;
    case K_PUSH:
      switch (op->code) {
        case ']': case '}': case ')': case 0x8f: {
          uint8_t kind = op->code == ']' ? N_LIST : op->code == '}' ? N_DICT : op->code == ')' ? N_TUPLE : N_SET;
          node_t *n = new_node(c, kind);
          if (!n) return fail(c, E_NOMEM, pos, "out of memory");
          if (kind == N_LIST) {
            tag_list(c, n, pos);
            if (c->err) { unref(c, n); return -1; }
          }
          v.t = V_OBJ; v.u.n = n;
          return vpush(c, v, pos);
        }
        case '2':
          if (!c->vsp) return underflow(c, pos);
          if (c->vs[c->vsp - 1].t == V_OBJ && c->vs[c->vsp - 1].u.n->stream != S_NONE)
            return fail(c, E_SHAPE, pos, "a streamed list is duplicated on the stack (DUP)");
          return vpush(c, share(c->vs[c->vsp - 1]), pos);
        case 'N': break;
        case 0x88: case 0x89: v.t = V_BOOL; v.u.i = op->code == 0x88; break;
        case 'K': v.t = V_INT; v.u.i = a[0]; break;
        case 'M': v.t = V_INT; v.u.i = (int64_t)rd_le(a, 2); break;
        case 'J': v.t = V_INT; v.u.i = (int32_t)(uint32_t)rd_le(a, 4); break;
        case 'G': { uint64_t bits = 0; for (int i = 0; i < 8; i++) bits = (bits << 8) | a[i]; v.t = V_FLOAT; memcpy(&v.u.f, &bits, 8); break; }
        case 'I': case 'L': {
          size_t n = op->size - 2;
          if (op->code == 'I' && n == 2 && a[0] == '0' && (a[1] == '0' || a[1] == '1')) { v.t = V_BOOL; v.u.i = a[1] == '1'; break; }
          if (parse_line_int(a, n, &v)) return bad_shape(c, pos, "an INT opcode does not hold a number");
          break;
        }
        case 'F': {
          char num[64];
          size_t n = op->size - 2;
          if (n >= sizeof num) return bad_shape(c, pos, "a FLOAT opcode does not hold a number");
          memcpy(num, a, n); num[n] = 0;
          char *end;
          v.t = V_FLOAT; v.u.f = strtod(num, &end);
          if (end == num) return bad_shape(c, pos, "a FLOAT opcode does not hold a number");
          break;
        }
        case 0x8a: case 0x8b: {  /* LONG1, LONG4: little-endian two's complement */
          int w = op->code == 0x8a ? 1 : 4;
          size_t n = (size_t)rd_le(a, w);
          if (n > 8) { v.t = V_BIG; break; }
          uint64_t x = n ? rd_le(a + w, (int)n) : 0;
          if (n && n < 8 && (x >> (8 * n - 1)) & 1) x |= ~(uint64_t)0 << (8 * n);
          v.t = V_INT; v.u.i = (int64_t)x;
          break;
        }
        case 'X': case 'T': v.t = V_STR; v.len = (uint32_t)rd_le(a, 4); v.u.s = a + 4; break;
        case 0x8c: case 'U': v.t = V_STR; v.len = a[0]; v.u.s = a + 1; break;
        case 0x8d: v.t = V_STR; v.len = (uint32_t)rd_le(a, 8); v.u.s = a + 8; break;
        case 'V': v.t = V_RAWSTR; v.len = (uint32_t)(op->size - 2); v.u.s = a; break;
        case 'S': {  /* Python 2's repr of a str: quoted; with an escape it is not text this reader compares */
          size_t n = op->size - 2;
          if (n < 2 || (a[0] != '\'' && a[0] != '"') || a[n - 1] != a[0]) return bad_shape(c, pos, "a STRING opcode is not quoted");
          v.t = memchr(a, '\\', n) ? V_BYTES : V_STR; v.len = (uint32_t)(n - 2); v.u.s = a + 1;
          break;
        }
        case 'B': v.t = V_BYTES; v.len = (uint32_t)rd_le(a, 4); v.u.s = a + 4; break;
        case 'C': v.t = V_BYTES; v.len = a[0]; v.u.s = a + 1; break;
        case 0x8e: case 0x96: v.t = V_BYTES; v.len = (uint32_t)rd_le(a, 8); v.u.s = a + 8; break;
        default: return bad_shape(c, pos, "an opcode this reader does not know");
      }
      return vpush(c, v, pos);
    case K_GET: {
      if (!bit(c->fetched, c->words, op->key)) return bad_shape(c, pos, "a memo key is fetched before it is stored");
      uint64_t r = rank_of(c, op->key);
      v = c->memo_vals[r];
      if (bit(c->again, c->words, op->key)) return vpush(c, share(v), pos);
      /* the only fetch of this key: the memo lets go of it, so the object lives no longer than its user */
      c->memo_vals[r].t = V_NONE;
      c->released++;
      return vpush(c, v, pos);
    }
    case K_MEMOIZE: case K_PUT: {
      if (!c->vsp) return underflow(c, pos);
      uint64_t key = in.kind == K_MEMOIZE ? c->memo2++ : op->key;
      if (!bit(c->fetched, c->words, key)) return 0;  /* nobody fetches it: not kept */
      val_t *top = &c->vs[c->vsp - 1];
      if (top->t == V_OBJ && top->u.n->stream != S_NONE && top->u.n->lost)
        return fail(c, E_SHAPE, pos, "a streamed list is memoized after some of its items were read");
      if (top->t == V_OBJ && top->u.n->stream != S_NONE && !top->u.n->keep) {
        /* a streamed list referred to again: still summarized as it is read, and kept whole as well */
        top->u.n->keep = 1;
        c->kept_lists++;
      }
      uint64_t r = rank_of(c, key);
      release(c, c->memo_vals[r]);
      c->memo_vals[r] = share(*top);
      if (top->t == V_OBJ) top->u.n->memo_slot = (uint32_t)(r + 1);
      return 0;
    }
    case K_MARK:
      if (c->vnm == c->cap_vm && grow((void **)&c->vmarks, &c->cap_vm, c->vnm + 1, sizeof(size_t)))
        return fail(c, E_NOMEM, pos, "out of memory");
      c->vmarks[c->vnm++] = c->vsp;
      return 0;
    case K_STOP: return 1;
    case K_POP:
      if (!c->vsp) return underflow(c, pos);
      release(c, c->vs[--c->vsp]);
      return 0;
    case K_POPMARK:
      if (vpop_mark(c, pos, &m)) return -1;
      while (c->vsp > m) release(c, c->vs[--c->vsp]);
      return 0;
    case K_APPEND: case K_APPENDS: {
      if (in.kind == K_APPEND) { if (c->vsp < 2) return underflow(c, pos); m = c->vsp - 1; }
      else if (vpop_mark(c, pos, &m)) return -1;
      if (m == 0) return underflow(c, pos);
      if (!is_node(&c->vs[m - 1], N_LIST)) return bad_shape(c, pos, "something that is not a list is appended to");
      return take(c, c->vs[m - 1].u.n, m, pos);
    }
    case K_SETITEM: case K_SETITEMS: {
      if (in.kind == K_SETITEM) { if (c->vsp < 3) return underflow(c, pos); m = c->vsp - 2; }
      else if (vpop_mark(c, pos, &m)) return -1;
      if (m == 0) return underflow(c, pos);
      if (!is_node(&c->vs[m - 1], N_DICT)) return bad_shape(c, pos, "items are set on something that is not a dict");
      if ((c->vsp - m) & 1) return bad_shape(c, pos, "a dict is given a key without a value");
      for (size_t i = m; i < c->vsp; i += 2)
        if (c->vs[i].t == V_OBJ && c->vs[i].u.n->kind != N_TUPLE && c->vs[i].u.n->kind != N_FROZENSET)
          return bad_shape(c, pos, "a dict key is a list, dict or set");
      node_t *d = c->vs[m - 1].u.n;
      if (add_items(c, d, c->vs + m, c->vsp - m, pos)) return -1;
      d->fclass = F_UNKNOWN;  /* a frame dict that changes: its cached class is stale */
      c->vsp = m;
      return 0;
    }
    case K_ADDITEMS: {
      if (vpop_mark(c, pos, &m)) return -1;
      if (m == 0) return underflow(c, pos);
      if (!is_node(&c->vs[m - 1], N_SET)) return bad_shape(c, pos, "items are added to something that is not a set");
      if (add_items(c, c->vs[m - 1].u.n, c->vs + m, c->vsp - m, pos)) return -1;
      c->vsp = m;
      return 0;
    }
    case K_FROMMARK: {
      if (vpop_mark(c, pos, &m)) return -1;
      size_t count = c->vsp - m;
      uint8_t kind = op->code == 'd' ? N_DICT : op->code == 'l' ? N_LIST : op->code == 't' ? N_TUPLE : N_FROZENSET;
      if (kind == N_DICT && (count & 1)) return bad_shape(c, pos, "a dict is given a key without a value");
      return collect(c, kind, count, pos);
    }
    case K_TUPLE2: case K_TUPLE3: {
      size_t k = in.kind == K_TUPLE2 ? 2 : 3;
      if (c->vsp < k) return underflow(c, pos);
      return collect(c, N_TUPLE, k, pos);
    }
    default: return 0;
  }
}

/* pos ends an element of a list that may be the root's `segments` or `device_traces`: summarize it and free it
   now, so that elements are summarized in the file's order, as the Python reader walks them: a trace fetched
   again from the memo is walked here, between the traces around it, not when the batch is appended. */
static void segment_done(ctx_t *c, size_t pos) {
  while (c->se_i < c->n_se && c->se[c->se_i].child <= pos) {
    const pair_t *e = &c->se[c->se_i++];
    if (e->child != pos) continue;
    if (c->has_seg && e->parent == c->seg_start && c->vsp > c->seg_slot + 1) {
      const val_t *list = &c->vs[c->seg_slot];
      if (!is_node(list, N_LIST) || list->u.n->stream != S_SEG || list->u.n->keep) continue;
      val_t *top = &c->vs[c->vsp - 1];
      summarize_segment(c, top);
      c->streamed_segments++;
      release(c, *top);
      top->t = V_DONE;
      list->u.n->lost = 1;
    } else if (c->has_dt && e->parent == c->dt_start && c->vsp > c->dt_slot + 1) {
      const val_t *list = &c->vs[c->dt_slot];
      if (!is_node(list, N_LIST) || list->u.n->stream != S_DT || list->u.n->keep) continue;
      val_t *top = &c->vs[c->vsp - 1];
      node_t *t = is_node(top, N_LIST) ? top->u.n : NULL;
      if (t && t->stream == S_TRACE && !t->placed) t->placed = 1;  /* streamed in its place as it was read */
      else summarize_trace(c, list->u.n->aux + (int64_t)(c->vsp - c->dt_slot - 2), top);
      release(c, *top);
      top->t = V_DONE;
      list->u.n->lost = 1;
    }
  }
  c->se_end = c->se_i < c->n_se ? c->se[c->se_i].child : SIZE_MAX;
}

/* ================= the API ================= */

void *ts_open(const char *path, int (*frame_code)(const char *, size_t, const char *, size_t)) {
  init_ops();
  ctx_t *c = calloc(1, sizeof(ctx_t));
  if (!c) return NULL;
  c->trace_peak_at = -1;
  c->tl_stride = c->tl_fill = 1;
  c->tl_a = c->tl_r = INT64_MIN;
  c->frame_code = frame_code;
  c->site_no_frames = intern(c, "(no frames)", 11);
  c->site_no_py = intern(c, "(no Python frame)", 17);
  int fd = open(path, O_RDONLY);
  if (fd < 0) { c->err = E_IO; snprintf(c->msg, sizeof c->msg, "%s", strerror(errno)); return c; }
  struct stat stt;
  if (fstat(fd, &stt) || stt.st_size == 0) {
    c->err = stt.st_size == 0 ? E_TRUNCATED : E_IO;
    snprintf(c->msg, sizeof c->msg, "%s", stt.st_size == 0 ? "the file is empty" : strerror(errno));
    close(fd);
    return c;
  }
  void *mp = mmap(NULL, (size_t)stt.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (mp == MAP_FAILED) { c->err = E_IO; snprintf(c->msg, sizeof c->msg, "%s", strerror(errno)); return c; }
  madvise(mp, (size_t)stt.st_size, MADV_SEQUENTIAL);
  c->buf = mp;
  c->len = (size_t)stt.st_size;
  c->root_ok = 1;
  return c;
}

/* after pass 1: the lists nested in the root's list values, and the dense ranks of the fetched keys */
static int finish_scan(ctx_t *c) {
  if (c->sp != 1 || c->buf[c->st[0].start] != '}') c->root_ok = 0;
  for (size_t i = 0; i < c->n_ll; i++) {
    for (size_t j = 1; j < c->n_rc; j += 2) {
      if (!(c->rc[j].is_list && c->rc[j].start == c->ll[i].parent)) continue;
      if (grow((void **)&c->l2, &c->cap_l2, c->n_l2 + 1, sizeof(pair_t))) return fail(c, E_NOMEM, 0, "out of memory");
      c->l2[c->n_l2++] = c->ll[i];
    }
  }
  c->rank = malloc((c->words + 1) * sizeof(uint32_t));
  if (!c->rank) return fail(c, E_NOMEM, 0, "out of memory");
  uint64_t acc = 0;
  for (size_t w = 0; w < c->words; w++) { c->rank[w] = (uint32_t)acc; acc += (uint64_t)ones(c->fetched[w]); }
  if (acc > 0xffffffffULL) return fail(c, E_SHAPE, 0, "too many shared objects");
  c->n_fetched = acc;
  c->n_memo = c->memo1;
  c->se_end = c->n_se ? c->se[0].child : SIZE_MAX;
  c->memo_vals = calloc(acc + 1, sizeof(val_t));
  if (!c->memo_vals) return fail(c, E_NOMEM, 0, "out of memory");
  madvise((void *)c->buf, c->len, MADV_DONTNEED);
  c->dropped = 0;
  free(c->st); c->st = NULL; c->cap_st = 0;
  free(c->ll); c->ll = NULL; c->cap_ll = 0;
  return 0;
}

/* Pass 1 up to byte `upto` (or the end). Returns 1 while there is more, 0 when done, -1 on error. */
int ts_scan(ctx_t *c, size_t upto) {
  if (c->err) return -1;
  if (c->scanned) return 0;
  size_t pos = c->pos1;
  op_t op;
  while (pos < upto) {
    if (pos >= c->len) return fail(c, E_TRUNCATED, pos, "the file ends before the pickle's STOP opcode");
    int r = step1(c, pos, &op);
    if (r < 0) return -1;
    pos += op.size;
    if (r == 1) {
      c->scanned = 1;
      return finish_scan(c) ? -1 : 0;
    }
    drop_behind(c, pos, 0);
  }
  c->pos1 = pos;
  return 1;
}

static inline int fits(acc_t v) { return v >= -(acc_t)INT64_MAX && v <= (acc_t)INT64_MAX; }

/* every figure the summary hands out fits in 64 bits (snapshot.py's OutOfRange checks the same ones) */
static int in_range(const ctx_t *c) {
  if (!fits(c->reserved) || !fits(c->allocated) || !fits(c->requested) || !fits(c->free_bytes) || !fits(c->live) ||
      !fits(c->trace_peak))
    return 0;
  for (int i = 0; i < PH_COUNT; i++) if (!fits(c->phase_bytes[i])) return 0;
  for (size_t i = 0; i < c->n_sites; i++) if (c->sites[i].order >= 0 && !fits(c->sites[i].bytes)) return 0;
  for (int64_t i = 0; i < c->tl_n; i++) if (!fits(c->tl_alloc[i]) || !fits(c->tl_res[i])) return 0;
  if (c->tl_fill != c->tl_stride && (!fits(c->tl_a) || !fits(c->tl_r))) return 0;
  return 1;
}

/* Pass 2 up to byte `upto`. Returns 1 while there is more, 0 when done (the summary is complete), -1 on error. */
int ts_eval(ctx_t *c, size_t upto) {
  if (c->err) return -1;
  if (!c->scanned) return fail(c, E_SHAPE, 0, "the file was not scanned first");
  if (c->done) return 0;
  size_t pos = c->pos2;
  uint64_t work0 = c->work;
  op_t op;
  while (pos < upto) {
    if (c->work_slice && c->work - work0 >= c->work_slice) break;  /* back to the caller: Ctrl-C, progress */
    if (pos == c->se_end) segment_done(c, pos);
    if (c->err) return -1;
    int r = step2(c, pos, &op);
    if (r < 0) return -1;
    pos += op.size;
    if (r == 1) {
      c->done = 1;
      break;
    }
    drop_behind(c, pos, (size_t)96 << 20);
  }
  c->pos2 = pos;
  if (!c->done) return 1;
  /* what was not streamed (a layout the streamer leaves alone) is summarized from the built root */
  if (c->vsp != 1 || !is_node(&c->vs[0], N_DICT)) return fail(c, E_NOSEG, pos, "the root is not a dict");
  node_t *root = c->vs[0].u.n;
  /* a key set twice: Python keeps the last value, and the first may be the one streamed */
  if (key_count(root, "segments", 8) > 1 || key_count(root, "device_traces", 13) > 1)
    return fail(c, E_SHAPE, pos, "the root dict sets a key twice");
  const val_t *segs = DGET(root, "segments");
  if (!is_node(segs, N_LIST)) return fail(c, E_NOSEG, pos, "no 'segments' list");
  node_t *sl = segs->u.n;
  sl->busy++;
  for (size_t i = 0; !sl->summarized && i < sl->n && !c->err; i++) summarize_segment(c, &sl->items[i]);
  sl->busy--;
  const val_t *traces = DGET(root, "device_traces");
  if (is_node(traces, N_LIST) && !traces->u.n->summarized) {
    node_t *tl = traces->u.n;
    tl->busy++;
    for (size_t i = 0; i < tl->n && !c->err; i++)
      if (!(is_node(&tl->items[i], N_LIST) && tl->items[i].u.n->stream == S_TRACE && !tl->items[i].u.n->placed))
        summarize_trace(c, (int64_t)i, &tl->items[i]);
    tl->busy--;
  }
  if (!c->err && !in_range(c)) fail(c, E_RANGE, pos, "sizes that add up beyond 64 bits");
  return c->err ? -1 : 0;
}

int ts_error(ctx_t *c) { return c ? c->err : E_NOMEM; }
const char *ts_message(ctx_t *c) { return c ? c->msg : "out of memory"; }
long long ts_offset(ctx_t *c) { return c ? (long long)c->err_off : 0; }
long long ts_size(ctx_t *c) { return c ? (long long)c->len : 0; }
/* the byte the pass now running has reached */
long long ts_position(ctx_t *c) { return c ? (long long)(c->scanned ? c->pos2 : c->pos1) : 0; }
long long ts_work(ctx_t *c) { return c ? (long long)c->work : 0; }

/* The most the summary may walk (0: no limit) and how much one ts_eval call walks before it returns. */
void ts_limits(ctx_t *c, long long budget, long long work_slice) {
  if (!c) return;
  c->budget = budget > 0 ? (uint64_t)budget : 0;
  c->work_slice = work_slice > 0 ? (uint64_t)work_slice : 0;
}

/* The summary's numbers, in the order snapshot_native.COUNTERS names them. */
void ts_counters(ctx_t *c, int64_t *out) {
  int64_t v[] = {c->segments, c->blocks, (int64_t)c->reserved, (int64_t)c->allocated, (int64_t)c->requested,
                 (int64_t)c->free_bytes, c->largest_free,
                 c->trace_events, (int64_t)c->live, (int64_t)c->trace_peak, c->trace_peak_at, c->n_largest, c->n_ooms,
                 (int64_t)c->n_memo, (int64_t)c->n_fetched, (int64_t)c->released, (int64_t)c->n_ops,
                 (int64_t)c->made_nodes, (int64_t)c->peak_nodes, (int64_t)c->streamed_segments,
                 (int64_t)c->streamed_events, (int64_t)c->n_sites, (int64_t)c->kept_lists,
                 (int64_t)c->phase_bytes[0], (int64_t)c->phase_bytes[1], (int64_t)c->phase_bytes[2],
                 (int64_t)c->phase_bytes[3], (int64_t)c->phase_bytes[4],
                 c->segment_events, c->tl_stride, c->tl_n + (c->tl_fill != c->tl_stride)};
  memcpy(out, v, sizeof v);
}

/* The timeline's points (ts_counters' timeline_points of them): the most live and reserved bytes in each, the
   open point last when an event went into it. */
void ts_timeline(ctx_t *c, int64_t *allocated, int64_t *reserved) {
  for (int64_t i = 0; i < c->tl_n; i++) { allocated[i] = (int64_t)c->tl_alloc[i]; reserved[i] = (int64_t)c->tl_res[i]; }
  if (c->tl_fill != c->tl_stride) { allocated[c->tl_n] = (int64_t)c->tl_a; reserved[c->tl_n] = (int64_t)c->tl_r; }
}

const char *ts_site(ctx_t *c, int32_t id) { return id >= 0 && (size_t)id < c->n_sites ? c->arena + c->sites[id].off : ""; }

static int by_bytes(const void *x, const void *y) {
  const site_t *a = *(site_t *const *)x, *b = *(site_t *const *)y;
  if (a->bytes != b->bytes) return a->bytes < b->bytes ? 1 : -1;
  return a->order < b->order ? -1 : a->order > b->order;
}

/* The k sites with the most bytes (first seen first among equals): their ids and bytes. Returns how many. */
int ts_top_sites(ctx_t *c, int k, int32_t *ids, int64_t *bytes) {
  site_t **all = malloc((c->n_sites + 1) * sizeof(site_t *));
  if (!all) return 0;
  size_t n = 0;
  for (size_t i = 0; i < c->n_sites; i++) if (c->sites[i].order >= 0) all[n++] = &c->sites[i];
  qsort(all, n, sizeof *all, by_bytes);
  int got = 0;
  for (size_t i = 0; i < n && got < k; i++, got++) { ids[got] = (int32_t)(all[i] - c->sites); bytes[got] = (int64_t)all[i]->bytes; }
  free(all);
  return got;
}

void ts_largest(ctx_t *c, int64_t *sizes, int32_t *sites) {
  for (int i = 0; i < c->n_largest; i++) { sizes[i] = c->largest[i].size; sites[i] = c->largest[i].site; }
}

/* each out-of-memory event: device, bytes kind, bytes, site, device_free kind, device_free (kinds: 0 None,
   1 int, 2 bool, 3 float bits) */
void ts_ooms(ctx_t *c, int64_t *out) { memcpy(out, c->ooms, (size_t)c->n_ooms * sizeof(oom_t)); }

void ts_close(ctx_t *c) {
  if (!c) return;
  if (c->memo_vals) for (uint64_t i = 0; i < c->n_fetched; i++) release(c, c->memo_vals[i]);
  while (c->vsp) release(c, c->vs[--c->vsp]);
  while (c->free_nodes) { node_t *n = c->free_nodes; c->free_nodes = n->next_free; free(n); }
  for (int k = 0; k < POOL_CLASSES; k++)
    while (c->pool[k]) { void *p = c->pool[k]; c->pool[k] = *(void **)p; free(p); }
  if (c->buf) munmap((void *)c->buf, c->len);
  free(c->fetched); free(c->again); free(c->defined); free(c->rank); free(c->st); free(c->marks); free(c->rc);
  free(c->ll); free(c->l2); free(c->se); free(c->vs); free(c->vmarks); free(c->memo_vals); free(c->fq);
  free(c->sites); free(c->table); free(c->arena); free(c->tmp);
  free(c);
}
