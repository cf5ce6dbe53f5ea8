/* snapshot_scan.c: a streaming, refusing scanner for PyTorch memory snapshots (pickles).
 *
 * Loaded by torchscalpel.memory.snapshot_native through ctypes (no Python or torch headers), compiled
 * on first use. It walks the pickle opcode stream at C speed and never builds an object:
 *
 *   pass 1 (ts_scan): refuses every opcode that is not plain data (globals, calls, object builds,
 *     persistent ids, extension codes, out-of-band buffers) with its byte offset; notes which memo keys
 *     are ever fetched; finds the root dict's children and the lists nested in the root's lists.
 *   pass 2 (ts_next, repeatedly): cuts the stream into self-contained pieces (a root key or value, one
 *     element of a root-level list such as `segments`, one element of a list inside one, such as
 *     `device_traces[i]`) and writes them, in batches, as small pickles that build a list of pieces:
 *     FRAME opcodes dropped, memo stores kept only for keys fetched later and renumbered densely (so
 *     objects nobody refers to again are not pinned by the unpickler's memo, and the memo array stays
 *     small), fetches renumbered the same way. One Python Unpickler reads every batch, so its memo
 *     carries the shared objects (strings, frame dicts, frame lists) from batch to batch.
 *
 * The file is mmapped read-only; pages behind the cursor are dropped (MADV_DONTNEED) every 32 MiB, so
 * the resident size stays bounded however large the file; a piece emitted later faults its pages back.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { E_OK = 0, E_REFUSED = 1, E_TRUNCATED = 2, E_NOTPICKLE = 3, E_SHAPE = 4, E_NOMEM = 5, E_IO = 6 };
enum { T_PLAIN = 0, T_ROOT = 1, T_L1 = 2, T_L2 = 3 };
enum { EV_KEY = 1, EV_VALUE = 2, EV_OPEN1 = 3, EV_ELEM1 = 4, EV_OPEN2 = 5, EV_ELEM2 = 6 };
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

typedef struct { size_t start; uint64_t memo; uint8_t tag, is_list; uint32_t ord; } slot_t;
typedef struct { size_t start, end; uint64_t memo; uint8_t is_list; } child_t;
typedef struct { size_t child, parent; } pair_t;
typedef struct { size_t sp, off; uint64_t memo; } mark_t;
/* a piece waiting to be written into a batch (a == b: an event with no bytes) */
typedef struct { size_t a, b; uint64_t memo; uint32_t code, arg; } piece_t;

typedef struct {
  const uint8_t *buf; size_t len;
  int err; size_t err_off; char msg[240];
  /* memo */
  uint64_t *fetched, *again, *defined; uint32_t *rank; size_t words; uint64_t n_memo, n_fetched; int memo_style;
  /* stack */
  slot_t *st; size_t sp, cap_st; mark_t *marks; size_t nm, cap_m; int pass;
  /* pass 1 skeleton */
  child_t *rc; size_t n_rc, cap_rc; pair_t *ll; size_t n_ll, cap_ll; int root_ok;
  size_t *l2s; uint32_t *l2p; size_t n_l2, cap_l2; size_t stop_off;
  /* pass 2 state */
  size_t pos; uint64_t memo; size_t rc_i, l2_i; uint32_t n_l1, n_l2_open; int done;
  size_t dropped;
  uint8_t *out; size_t out_n, out_cap; uint32_t *ev; size_t ev_n, ev_cap;
  piece_t *q; size_t q_n, q_head, q_cap;
  uint64_t n_ops, released;
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

/* memo bitmaps grow with the largest key seen */
static int memo_room(ctx_t *c, uint64_t key) {
  size_t need = (size_t)(key >> 6) + 1;
  if (need <= c->words) return 0;
  if (key > (uint64_t)c->len * 2 + 4096) return -1;  /* no valid pickle of this size has that key */
  size_t n = c->words ? c->words : 1024;
  while (n < need) n *= 2;
  uint64_t *f = realloc(c->fetched, n * 8), *d, *g;
  if (!f) return -1;
  c->fetched = f;
  d = realloc(c->defined, n * 8);
  if (!d) return -1;
  c->defined = d;
  g = realloc(c->again, n * 8);
  if (!g) return -1;
  c->again = g;
  memset(c->fetched + c->words, 0, (n - c->words) * 8);
  memset(c->defined + c->words, 0, (n - c->words) * 8);
  memset(c->again + c->words, 0, (n - c->words) * 8);
  c->words = n;
  return 0;
}

static inline int bit(const uint64_t *m, size_t words, uint64_t k) {
  return (k >> 6) < words && (m[k >> 6] >> (k & 63)) & 1;
}

typedef struct { int code; size_t size; uint64_t key; } op_t;

static uint64_t rd_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* Decode the opcode at pos: its total size and, for memo opcodes, the key. */
static int decode(ctx_t *c, size_t pos, op_t *op) {
  const uint8_t *b = c->buf;
  size_t end = c->len;
  int code = b[pos];
  opinfo_t in = OPS[code];
  op->code = code;
  op->key = 0;
  if (in.kind == K_UNKNOWN) {
    char m[80];
    snprintf(m, sizeof m, "byte 0x%02x is not a pickle opcode", code);
    return fail(c, E_NOTPICKLE, pos, m);
  }
  size_t p = pos + 1, n = 0;
  switch (in.arg) {
    case A_NONE: break;
    case A_FIX: n = in.n; break;
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
    case A_LEN1: case A_LEN4: case A_LEN8: {
      int w = in.arg == A_LEN1 ? 1 : in.arg == A_LEN4 ? 4 : 8;
      if (p + (size_t)w > end) return fail(c, E_TRUNCATED, pos, "the file ends inside an opcode");
      uint64_t l = rd_le(b + p, w);
      if (l > end) return fail(c, E_TRUNCATED, pos, "the file ends inside an opcode");
      n = (size_t)w + (size_t)l;
      break;
    }
  }
  if (p + n > end) return fail(c, E_TRUNCATED, pos, "the file ends inside an opcode");
  if (in.arg == A_FIX && (in.kind == K_GET || in.kind == K_PUT)) op->key = rd_le(b + p, in.n);
  op->size = 1 + n;
  return 0;
}

static int push(ctx_t *c, size_t start, uint8_t is_list) {
  if (grow((void **)&c->st, &c->cap_st, c->sp + 1, sizeof(slot_t))) return fail(c, E_NOMEM, start, "out of memory");
  slot_t *s = &c->st[c->sp++];
  s->start = start; s->memo = c->memo; s->tag = T_PLAIN; s->is_list = is_list; s->ord = 0;
  return 0;
}

static int underflow(ctx_t *c, size_t pos) { return fail(c, E_NOTPICKLE, pos, "the opcodes take more from the stack than it holds"); }

static mark_t pop_mark(ctx_t *c, size_t pos, int *bad) {
  mark_t none = {0, 0, 0};
  if (!c->nm) { *bad = 1; underflow(c, pos); return none; }
  mark_t m = c->marks[--c->nm];
  if (m.sp > c->sp) { *bad = 1; underflow(c, pos); return none; }
  return m;
}

/* pass 2: an opcode other than APPEND(S)/SETITEM(S) that takes a streamed container off the stack */
static int skel_taken(ctx_t *c, size_t from, size_t pos) {
  if (c->pass != 2) { if (from == 0) c->root_ok = 0; return 0; }
  for (size_t i = from; i < c->sp; i++)
    if (c->st[i].tag != T_PLAIN) return fail(c, E_SHAPE, pos, "a streamed container is taken apart");
  return 0;
}

/* The shape checks and the memo bookkeeping shared by both passes; pass 2 adds emission (hooks). */
static int pass2_consume(ctx_t *c, size_t parent, size_t first, size_t last, size_t op_off);

/* pass 2: queue a piece [a, b) (or, with a == b, an event alone); ts_next writes the queue into batches */
static int enqueue(ctx_t *c, size_t a, size_t b, uint64_t memo, uint32_t code, uint32_t arg) {
  if (grow((void **)&c->q, &c->q_cap, c->q_n + 1, sizeof(piece_t))) return fail(c, E_NOMEM, a, "out of memory");
  piece_t *p = &c->q[c->q_n++];
  p->a = a; p->b = b; p->memo = memo; p->code = code; p->arg = arg;
  return 0;
}

static void drop_behind(ctx_t *c, size_t pos) {
  size_t page = 4096, upto = pos & ~(page - 1);
  if (upto >= c->dropped + ((size_t)32 << 20)) {
    madvise((void *)c->buf, upto, MADV_DONTNEED);
    c->dropped = upto;
  }
}

/* One opcode of either pass. pass 1 records the skeleton; pass 2 emits pieces. */
static int step(ctx_t *c, size_t pos, op_t *op) {
  int pass = c->pass;
  if (decode(c, pos, op)) return -1;
  opinfo_t in = OPS[op->code];
  int bad = 0;
  c->n_ops++;
  switch (in.kind) {
    case K_REFUSE: {
      char m[160];
      snprintf(m, sizeof m, "%s", NAMES[op->code]);
      return fail(c, E_REFUSED, pos, m);
    }
    case K_FRAME: break;
    case K_NONE:
      if (op->code == 0x85) {  /* TUPLE1 */
        if (!c->sp) return underflow(c, pos);
        if (skel_taken(c, c->sp - 1, pos)) return -1;
        c->st[c->sp - 1].is_list = 0;
      }
      break;
    case K_PUSH: {
      uint8_t is_list = op->code == ']';
      if (op->code == '2') return fail(c, E_SHAPE, pos, "DUP is not written by Python's pickler");
      if (push(c, pos, is_list)) return -1;
      if (pass == 2 && is_list && c->l2_i < c->n_l2 && c->l2s[c->l2_i] == pos) {
        slot_t *s = &c->st[c->sp - 1];
        s->tag = T_L2; s->ord = c->n_l2_open++;
        if (enqueue(c, pos, pos, 0, EV_OPEN2, c->l2p[c->l2_i])) return -1;
        c->l2_i++;
      }
      if (pass == 2 && c->rc_i < c->n_rc && c->rc[c->rc_i].start == pos && c->rc[c->rc_i].is_list && c->sp >= 2 &&
          c->st[0].tag == T_ROOT) {
        slot_t *s = &c->st[c->sp - 1];
        s->tag = T_L1; s->ord = c->n_l1++;
        if (enqueue(c, pos, pos, 0, EV_OPEN1, s->ord)) return -1;
      }
      if (c->sp == 1 && pass == 2) c->st[0].tag = (c->root_ok ? T_ROOT : T_PLAIN);
      break;
    }
    case K_GET:
      if (!bit(c->defined, c->words, op->key)) return fail(c, E_NOTPICKLE, pos, "a memo key is fetched before it is stored");
      if (pass == 1) {  /* fetched, and fetched more than once: a key fetched once is released after it */
        uint64_t m = (uint64_t)1 << (op->key & 63);
        if (c->fetched[op->key >> 6] & m) c->again[op->key >> 6] |= m;
        c->fetched[op->key >> 6] |= m;
      }
      if (push(c, pos, 0)) return -1;
      break;
    case K_MEMOIZE: case K_PUT: {
      if (!c->sp) return underflow(c, pos);
      int style = in.kind == K_MEMOIZE ? 1 : 2;
      if (c->memo_style && c->memo_style != style) return fail(c, E_SHAPE, pos, "mixed memo styles");
      c->memo_style = style;
      uint64_t key = in.kind == K_MEMOIZE ? c->memo : op->key;
      if (memo_room(c, key)) return fail(c, E_NOTPICKLE, pos, "a memo key is out of range");
      if (!bit(c->defined, c->words, key)) { c->defined[key >> 6] |= (uint64_t)1 << (key & 63); }
      if (in.kind == K_MEMOIZE) c->memo++;
      if (pass == 2) {
        slot_t *top = &c->st[c->sp - 1];
        if (top->tag != T_PLAIN && bit(c->fetched, c->words, key))
          return fail(c, E_SHAPE, pos, "a container the reader streams is referred to again");
      }
      break;
    }
    case K_MARK:
      if (grow((void **)&c->marks, &c->cap_m, c->nm + 1, sizeof(size_t))) return fail(c, E_NOMEM, pos, "out of memory");
      c->marks[c->nm].sp = c->sp; c->marks[c->nm].off = pos; c->marks[c->nm].memo = c->memo;
      c->nm++;
      break;
    case K_STOP:
      if (c->sp != 1) return fail(c, E_NOTPICKLE, pos, "the pickle stops with other than one object built");
      return 1;
    case K_POP:
      if (!c->sp) return underflow(c, pos);
      if (skel_taken(c, c->sp - 1, pos)) return -1;
      c->sp--;
      break;
    case K_POPMARK: {
      mark_t m = pop_mark(c, pos, &bad);
      if (bad) return -1;
      if (skel_taken(c, m.sp, pos)) return -1;
      c->sp = m.sp;
      break;
    }
    case K_APPEND: case K_SETITEM: {
      size_t k = in.kind == K_APPEND ? 1 : 2;
      if (c->sp < k + 1) return underflow(c, pos);
      size_t parent = c->sp - k - 1;
      if (pass2_consume(c, parent, parent + 1, c->sp, pos)) return -1;
      c->sp = parent + 1;
      break;
    }
    case K_APPENDS: case K_SETITEMS: case K_ADDITEMS: {
      mark_t mk = pop_mark(c, pos, &bad);
      if (bad) return -1;
      size_t m = mk.sp;
      if (m == 0) return underflow(c, pos);
      if (in.kind != K_ADDITEMS && pass2_consume(c, m - 1, m, c->sp, pos)) return -1;
      if (in.kind == K_ADDITEMS && skel_taken(c, m - 1, pos)) return -1;
      c->sp = m;
      break;
    }
    case K_FROMMARK: {
      mark_t mk = pop_mark(c, pos, &bad);
      if (bad) return -1;
      if (skel_taken(c, mk.sp, pos)) return -1;
      c->sp = mk.sp;
      /* the object built from the mark starts at the mark */
      if (push(c, mk.off, 0)) return -1;
      c->st[c->sp - 1].memo = mk.memo;
      break;
    }
    case K_TUPLE2: case K_TUPLE3: {
      size_t k = in.kind == K_TUPLE2 ? 2 : 3;
      if (c->sp < k) return underflow(c, pos);
      if (skel_taken(c, c->sp - k, pos)) return -1;
      c->sp -= k - 1;
      c->st[c->sp - 1].is_list = 0;
      c->st[c->sp - 1].tag = T_PLAIN;
      break;
    }
    default: break;
  }
  return 0;
}

/* ---- pass 1 ---- */

static int pass1_consume(ctx_t *c, size_t parent, size_t first, size_t last, size_t op_off) {
  if (parent == 0 && (c->buf[op_off] == 'a' || c->buf[op_off] == 'e' || ((last - first) & 1))) c->root_ok = 0;
  if (parent == 0 && c->root_ok) {
    for (size_t i = first; i < last; i++) {
      if (grow((void **)&c->rc, &c->cap_rc, c->n_rc + 1, sizeof(child_t))) return fail(c, E_NOMEM, op_off, "out of memory");
      child_t *ch = &c->rc[c->n_rc++];
      ch->start = c->st[i].start;
      ch->end = i + 1 < last ? c->st[i + 1].start : op_off;
      ch->is_list = c->st[i].is_list && c->buf[ch->start] == ']';
      ch->memo = 0;
      if (c->n_rc > 4096) { c->root_ok = 0; return 0; }
    }
  } else if (c->st[parent].is_list) {
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


/* A memo opcode with a dense key: BINGET/BINPUT ('h'/'q') when it fits a byte, else LONG_BINGET/LONG_BINPUT. */
static void put_memo(ctx_t *c, uint8_t short_code, uint64_t r) {
  if (r < 256) {
    c->out[c->out_n++] = short_code;
    c->out[c->out_n++] = (uint8_t)r;
  } else {
    c->out[c->out_n++] = short_code == 'h' ? 'j' : 'r';
    for (int i = 0; i < 4; i++) c->out[c->out_n++] = (uint8_t)(r >> (8 * i));
  }
}

/* Copy [a, b) into the batch, rewritten: FRAME and PROTO dropped, memo stores kept only for fetched keys,
   and every key renumbered to its rank among the fetched ones. */
static int emit_range(ctx_t *c, size_t a, size_t b, uint64_t memo, uint32_t code, uint32_t arg) {
  if (a == b) goto event;
  /* the rewrite can grow a piece: each memo opcode (1 byte at least) becomes 12 bytes at most (a fetch with its
     release), so 12x bounds it
     (reserved, not touched: the pages a piece does not use are never made resident) */
  if (grow((void **)&c->out, &c->out_cap, c->out_n + (b - a) * 12 + 64, 1)) return fail(c, E_NOMEM, a, "out of memory");
  size_t pos = a, run = a;  /* [run, pos): plain opcodes not yet copied, copied in one memcpy */
  op_t op;
  while (pos < b) {
    /* decode() only reads; errors here cannot happen after pass 1 */
    if (decode(c, pos, &op)) return -1;
    opinfo_t in = OPS[op.code];
    int memo_op = in.kind == K_MEMOIZE || in.kind == K_PUT || in.kind == K_GET;
    if (!memo_op && in.kind != K_FRAME && op.code != 0x80) { pos += op.size; continue; }
    memcpy(c->out + c->out_n, c->buf + run, pos - run);
    c->out_n += pos - run;
    if (memo_op) {
      uint64_t key = in.kind == K_MEMOIZE ? memo++ : op.key;
      if (in.kind == K_GET || bit(c->fetched, c->words, key)) {
        uint64_t r = c->rank[key >> 6] + (uint64_t)__builtin_popcountll(c->fetched[key >> 6] & (((uint64_t)1 << (key & 63)) - 1));
        put_memo(c, in.kind == K_GET ? 'h' : 'q', r);
        /* the only fetch of this key: the memo lets go of it (None stored over it, then popped), so an
           object shared once (a block's traceback and its trace event's) lives no longer than its user */
        if (in.kind == K_GET && !bit(c->again, c->words, key)) {
          c->out[c->out_n++] = 'N';
          put_memo(c, 'q', r);
          c->out[c->out_n++] = '0';
          c->released++;
        }
      }
    }
    pos += op.size;
    run = pos;
  }
  memcpy(c->out + c->out_n, c->buf + run, pos - run);
  c->out_n += pos - run;
event:
  if (grow((void **)&c->ev, &c->ev_cap, c->ev_n + 2, 4)) return fail(c, E_NOMEM, a, "out of memory");
  c->ev[c->ev_n++] = code; c->ev[c->ev_n++] = arg;
  return 0;
}

static int pass2_consume(ctx_t *c, size_t parent, size_t first, size_t last, size_t op_off) {
  if (c->pass == 1) return pass1_consume(c, parent, first, last, op_off);
  slot_t *p = &c->st[parent];
  for (size_t i = first; i < last; i++)
    if (c->st[i].tag == T_ROOT || (c->st[i].tag == T_L1 && p->tag != T_ROOT) ||
        (c->st[i].tag == T_L2 && p->tag != T_L1))
      return fail(c, E_SHAPE, op_off, "a streamed list ends up somewhere unexpected");
  if (p->tag != T_L1 && p->tag != T_L2) return 0;
  for (size_t i = first; i < last; i++) {
    if (c->st[i].tag == T_L2) continue;
    size_t end = i + 1 < last ? c->st[i + 1].start : op_off;
    if (enqueue(c, c->st[i].start, end, c->st[i].memo, p->tag == T_L1 ? EV_ELEM1 : EV_ELEM2, p->ord)) return -1;
  }
  return 0;
}

/* ---- the API ---- */

void *ts_open(const char *path) {
  init_ops();
  ctx_t *c = calloc(1, sizeof(ctx_t));
  if (!c) return NULL;
  int fd = open(path, O_RDONLY);
  if (fd < 0) { c->err = E_IO; snprintf(c->msg, sizeof c->msg, "%s", strerror(errno)); return c; }
  struct stat stt;
  if (fstat(fd, &stt) || stt.st_size == 0) {
    c->err = stt.st_size == 0 ? E_TRUNCATED : E_IO;
    snprintf(c->msg, sizeof c->msg, "%s", stt.st_size == 0 ? "the file is empty" : strerror(errno));
    close(fd);
    return c;
  }
  void *m = mmap(NULL, (size_t)stt.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) { c->err = E_IO; snprintf(c->msg, sizeof c->msg, "%s", strerror(errno)); return c; }
  madvise(m, (size_t)stt.st_size, MADV_SEQUENTIAL);
  c->buf = m;
  c->len = (size_t)stt.st_size;
  return c;
}

static void reset_walk(ctx_t *c) {
  c->sp = 0; c->nm = 0; c->memo = 0; c->memo_style = 0; c->n_ops = 0;
  if (c->words) memset(c->defined, 0, c->words * 8);
}

/* Pass 1 over the whole file. Returns an E_ code. */
int ts_scan(ctx_t *c) {
  if (c->err) return c->err;
  c->pass = 1;
  reset_walk(c);
  c->root_ok = 1;
  c->dropped = 0;
  size_t pos = 0;
  op_t op;
  for (;;) {
    if (pos >= c->len) { fail(c, E_TRUNCATED, pos, "the file ends before the pickle's STOP opcode"); return c->err; }
    if (c->sp == 0 && c->buf[pos] != 0x80 && c->buf[pos] != 0x95 && c->buf[pos] != '}') c->root_ok = 0;
    int r = step(c, pos, &op);
    if (r < 0) return c->err;
    pos += op.size;
    if (r == 1) break;
    drop_behind(c, pos);
  }
  c->stop_off = pos - 1;
  if (c->sp != 1 || c->buf[c->st[0].start] != '}') c->root_ok = 0;
  /* the lists nested in a root-level list (device_traces[i]) */
  for (size_t i = 0; i < c->n_ll; i++) {
    for (size_t j = 0; j < c->n_rc; j++) {
      if (c->rc[j].is_list && c->rc[j].start == c->ll[i].parent && (j & 1)) {
        if (grow((void **)&c->l2s, &c->cap_l2, c->n_l2 + 1, sizeof(size_t)) ||
            !(c->l2p = realloc(c->l2p, (c->n_l2 + 1) * sizeof(uint32_t)))) {
          fail(c, E_NOMEM, 0, "out of memory");
          return c->err;
        }
        uint32_t ord = 0;
        for (size_t k = 0; k < j; k++) ord += (c->rc[k].is_list && (k & 1));
        c->l2s[c->n_l2] = c->ll[i].child;
        c->l2p[c->n_l2] = ord;
        c->n_l2++;
      }
    }
  }
  /* keys of the root are even children, values odd; only values are streamed */
  for (size_t j = 0; j < c->n_rc; j++) if (!(j & 1)) c->rc[j].is_list = 0;
  /* ranks of the fetched keys */
  c->rank = malloc((c->words + 1) * sizeof(uint32_t));
  if (!c->rank && c->words) { fail(c, E_NOMEM, 0, "out of memory"); return c->err; }
  uint64_t acc = 0;
  for (size_t w = 0; w < c->words; w++) { c->rank[w] = (uint32_t)acc; acc += (uint64_t)__builtin_popcountll(c->fetched[w]); }
  c->n_fetched = acc;
  c->n_memo = c->memo;
  if (acc > 0xffffffffULL) { fail(c, E_SHAPE, 0, "too many shared objects"); return c->err; }
  if (!c->root_ok) { fail(c, E_SHAPE, 0, "the root is not a dict the reader can stream"); return c->err; }
  madvise((void *)c->buf, c->len, MADV_DONTNEED);
  c->pass = 2;
  reset_walk(c);
  c->dropped = 0;
  c->pos = 0;
  return E_OK;
}

/* Pass 2: the next batch. Returns its size in bytes (0 at the end, -1 on error); *data and *events point
   into buffers the next call reuses; *n_events counts (code, arg) pairs. */
long long ts_next(ctx_t *c, const uint8_t **data, const uint32_t **events, size_t *n_events, size_t batch) {
  if (c->err) return -1;
  if (c->done && c->q_head >= c->q_n) return 0;
  c->out_n = 0; c->ev_n = 0;
  static const uint8_t head[] = {0x80, 4, 0x95, 0, 0, 0, 0, 0, 0, 0, 0, ']', '('};
  if (grow((void **)&c->out, &c->out_cap, sizeof head + 64, 1)) { fail(c, E_NOMEM, 0, "out of memory"); return -1; }
  memcpy(c->out, head, sizeof head);
  c->out_n = sizeof head;
  op_t op;
  while (c->out_n < batch && c->ev_n < 2 * 65536) {
    if (c->q_head < c->q_n) {  /* write what is queued first: a batch holds whole pieces, about `batch` bytes */
      piece_t *p = &c->q[c->q_head++];
      if (emit_range(c, p->a, p->b, p->memo, p->code, p->arg)) return -1;
      continue;
    }
    c->q_n = c->q_head = 0;
    if (c->done) break;
    size_t pos = c->pos;
    /* a root child that is complete: emit it (a list value was streamed instead) */
    while (c->rc_i < c->n_rc && c->rc[c->rc_i].end == pos) {
      child_t *ch = &c->rc[c->rc_i];
      if (!ch->is_list && enqueue(c, ch->start, ch->end, ch->memo, (c->rc_i & 1) ? EV_VALUE : EV_KEY, 0)) return -1;
      c->rc_i++;
    }
    if (c->rc_i < c->n_rc && c->rc[c->rc_i].start == pos) c->rc[c->rc_i].memo = c->memo;
    int r = step(c, pos, &op);
    if (r < 0) return -1;
    c->pos = pos + op.size;
    if (r == 1) c->done = 1;
    drop_behind(c, c->pos);
  }
  if (c->out_n == sizeof head && c->ev_n == 0) return 0;
  if (grow((void **)&c->out, &c->out_cap, c->out_n + 2, 1)) { fail(c, E_NOMEM, 0, "out of memory"); return -1; }
  c->out[c->out_n++] = 'e';
  c->out[c->out_n++] = '.';
  uint64_t flen = c->out_n - 11;
  for (int i = 0; i < 8; i++) c->out[3 + i] = (uint8_t)(flen >> (8 * i));
  *data = c->out;
  *events = c->ev;
  *n_events = c->ev_n / 2;
  return (long long)c->out_n;
}

int ts_error(ctx_t *c) { return c ? c->err : E_NOMEM; }
const char *ts_message(ctx_t *c) { return c ? c->msg : "out of memory"; }
long long ts_offset(ctx_t *c) { return c ? (long long)c->err_off : 0; }
long long ts_size(ctx_t *c) { return (long long)c->len; }
/* n_memo, n_fetched, n_ops of the last pass, root children, nested lists, memo entries released after their one fetch */
void ts_stats(ctx_t *c, uint64_t *out) {
  out[0] = c->n_memo; out[1] = c->n_fetched; out[2] = c->n_ops; out[3] = c->n_rc; out[4] = c->n_l2; out[5] = c->released;
}

void ts_close(ctx_t *c) {
  if (!c) return;
  if (c->buf) munmap((void *)c->buf, c->len);
  free(c->fetched); free(c->again); free(c->defined); free(c->rank); free(c->st); free(c->marks); free(c->rc); free(c->ll);
  free(c->l2s); free(c->l2p); free(c->out); free(c->ev); free(c->q);
  free(c);
}
