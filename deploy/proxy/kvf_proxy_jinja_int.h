/*
 * The chat-template renderer's inside (kvf_proxy_jinja.h), shared by its eight files:
 *   kvf_proxy_jinja_lex.c    the template into text / {{ expr }} / {% stmt %} pieces, and an
 *                            expression into tokens;
 *   kvf_proxy_jinja_parse.c  tokens into expression trees;
 *   kvf_proxy_jinja_stmt.c   pieces into a statement tree;
 *   kvf_proxy_jinja_value.c  values (cJSON nodes; undefined is a node of type cJSON_Invalid):
 *                            truthiness, Python's str() and json.dumps();
 *   kvf_proxy_jinja_eval.c   expressions evaluated: operators, tests;
 *   kvf_proxy_jinja_filter.c filters;
 *   kvf_proxy_jinja_call.c   calls: global functions, macros, methods;
 *   kvf_proxy_jinja.c        statements run, and the entry point.
 * Nothing here is used outside those files.
 */
#ifndef KVF_PROXY_JINJA_INT_H
#define KVF_PROXY_JINJA_INT_H

#include "kvf_status.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

/* ---- pieces and tokens (kvf_proxy_jinja_lex.c) ------------------------------------------ */

typedef enum { KVF_P_TEXT, KVF_P_EXPR, KVF_P_STMT } kvf_piece_kind_t;

typedef struct {
    kvf_piece_kind_t kind;
    const char      *s;     /* text, or the tag's inside */
    size_t           n;
    size_t           at;    /* offset in the template */
} kvf_piece_t;

typedef struct {
    kvf_piece_t *v;   /* malloc'd; the pieces point into the template */
    int          n, cap;
} kvf_pieces_t;

typedef enum { KVF_T_END, KVF_T_NAME, KVF_T_NUM, KVF_T_STR, KVF_T_OP } kvf_tok_kind_t;

typedef struct {
    kvf_tok_kind_t kind;
    char          *text;   /* name, op, or the decoded string (owned) */
    double         num;
} kvf_tok_t;

typedef struct {
    kvf_tok_t *v;      /* ends with a KVF_T_END token */
    int        n, pos;
} kvf_toks_t;

/**
 * Split template @a t into pieces (appended to @a out, zeroed by the caller; free out->v).
 * Jinja's whitespace rules: '-' markers, trim_blocks, lstrip_blocks ('+' keeps the blanks).
 * @return KVF_OK; KVF_ERR_PARSE (an unclosed tag, its offset in @a err); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_jinja_lex(const char *t, kvf_pieces_t *out, char *err, size_t cap);

/**
 * The tokens of the @a n bytes at @a s (an expression or a statement's inside) into @a out
 * (free with kvf_jinja_toks_free(); on error nothing is left to free).
 * @return KVF_OK; KVF_ERR_PARSE (an unterminated string, an unexpected character);
 *         KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_jinja_tokenize(const char *s, size_t n, kvf_toks_t *out, char *err,
                                size_t cap);

/** Free the tokens of kvf_jinja_tokenize() (NULL-safe inside). */
void kvf_jinja_toks_free(kvf_toks_t *t);

/* ---- trees (kvf_proxy_jinja_parse.c, kvf_proxy_jinja_stmt.c) ------------------------------------------------------ */

typedef enum {
    KVF_E_LIT, KVF_E_NAME, KVF_E_LIST, KVF_E_DICT, KVF_E_ATTR, KVF_E_ITEM, KVF_E_SLICE,
    KVF_E_CALL, KVF_E_FILTER, KVF_E_TEST, KVF_E_BIN, KVF_E_NOT, KVF_E_NEG, KVF_E_AND,
    KVF_E_OR, KVF_E_COND, KVF_E_NONE_SLOT,
} kvf_ekind_t;

typedef struct kvf_expr kvf_expr_t;
struct kvf_expr {
    kvf_ekind_t  kind;
    char        *name;       /* NAME, ATTR, CALL (method or function), FILTER, TEST, BIN op */
    cJSON       *lit;        /* LIT */
    kvf_expr_t  *a, *b, *c;  /* operands; SLICE: a[b:c:d] with d in args[0] */
    kvf_expr_t **args;       /* LIST items, DICT k,v pairs, CALL/FILTER/TEST arguments */
    char       **kwnames;    /* per argument: keyword name or NULL */
    int          nargs;
    bool         negate;     /* TEST: is not; BIN "in": not in; LIST: a tuple */
};

typedef enum {
    KVF_S_TEXT, KVF_S_OUT, KVF_S_IF, KVF_S_FOR, KVF_S_SET, KVF_S_BLOCK, KVF_S_MACRO,
    KVF_S_BREAK, KVF_S_CONTINUE,
} kvf_skind_t;

typedef struct kvf_node kvf_node_t;
typedef struct {
    kvf_node_t **v;
    int          n;
} kvf_body_t;

struct kvf_node {
    kvf_skind_t kind;
    const char *text;        /* TEXT */
    size_t      len;
    kvf_expr_t *expr;        /* OUT, SET value (NULL: the block form), FOR iterable, BLOCK:
                              * the filters of a filter block (NULL: generation); MACRO:
                              * a call whose arguments are the parameters (kwnames) and
                              * their defaults (NULL: none) */
    kvf_expr_t **conds;      /* IF: one per branch (NULL: else) */
    kvf_body_t *branches;    /* IF: per branch; FOR: [0] body, [1] else; SET block, MACRO,
                              * BLOCK: [0] */
    int         nbranch;
    char       *target[2];   /* FOR: loop names; SET: name[.attr] in target[0], target[1];
                              * MACRO: its name */
    kvf_expr_t *filter;      /* FOR ... if cond */
};

/* The expression parser's state over the tokens of one expression or statement. */
typedef struct {
    kvf_toks_t  *t;
    char        *err;
    size_t       cap;
    kvf_status_t status;
    int          depth;    /* nesting so far (KVF_JINJA_MAX_NEST: the C stack is bounded) */
} kvf_ps_t;

/* How deep expressions, and statements, may nest in a template (real ones: under 20). */
#define KVF_JINJA_MAX_NEST 100

/** The token at the parser's position (the END token at the end). */
kvf_tok_t *kvf_jinja_peek(kvf_ps_t *p);
/** Whether the token at the position is operator @a op / name @a name. */
bool kvf_jinja_is_op(kvf_ps_t *p, const char *op);
bool kvf_jinja_is_name(kvf_ps_t *p, const char *name);
/** Record the parser's first failure (@a what, with the token it stopped at). */
void kvf_jinja_ps_fail(kvf_ps_t *p, kvf_status_t st, const char *what);
/** A zeroed node of kind @a k (NULL: no memory). */
kvf_expr_t *kvf_jinja_new(kvf_ekind_t k);
/** Append argument @a a (taken; NULL fails) with keyword @a kw (taken; NULL: positional). */
bool kvf_jinja_add_arg(kvf_expr_t *e, kvf_expr_t *a, char *kw);
/** A whole expression (with 'x if c else y'); or-level only (for 'for ... in X if C'). */
kvf_expr_t *kvf_jinja_parse_expr(kvf_ps_t *p);
kvf_expr_t *kvf_jinja_parse_or(kvf_ps_t *p);
/** Free an expression tree (NULL-safe). */
void kvf_jinja_expr_free(kvf_expr_t *e);

/* The name a filter block's text is held in while its filters run (a space: no template can
 * name it). */
#define KVF_JINJA_BLOCK_VAR " block"

/**
 * Lex and parse template @a tmpl into @a body (zeroed by the caller; free with
 * kvf_jinja_body_free(), also on error). The text nodes point into @a tmpl, which must
 * outlive @a body.
 * @return KVF_OK; KVF_ERR_PARSE (syntax, with its offset); KVF_ERR_UNSUPPORTED (a statement
 *         or form outside the subset, by name); KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_jinja_parse(const char *tmpl, kvf_body_t *body, char *err, size_t cap);

/** Free the nodes of @a b (not @a b itself); @a b is left empty. */
void kvf_jinja_body_free(kvf_body_t *b);

/* ---- values (kvf_proxy_jinja_value.c) ------------------------------------------------------ */

/* A growable string: s is NUL-terminated once anything was added; a failed growth drops
 * the addition (the caller sees a shorter string, never a crash). */
typedef struct {
    char  *s;
    size_t n, cap;
} kvf_sb_t;

void kvf_jinja_sb_add(kvf_sb_t *b, const char *s, size_t n);
void kvf_jinja_sb_str(kvf_sb_t *b, const char *s);

/* Flags on a value's cJSON type (above cJSON's own bits; cJSON_Duplicate keeps them): a
 * string marked safe (Jinja's Markup: what is added to it is HTML-escaped), a list that is
 * a generator (the result of map / select: not JSON, no length), a tuple (printed with
 * parentheses). */
#define KVF_JINJA_MARKUP (1 << 12)
#define KVF_JINJA_GEN    (1 << 13)
#define KVF_JINJA_TUPLE  (1 << 14)
#define KVF_JINJA_FLOAT  (1 << 15)   /* a number that is a Python float (2.0 prints "2.0") */
/* dict.items() / keys() / values(): a view (prints as dict_items([...]), not JSON) */
#define KVF_JINJA_ITEMS  (1 << 16)
#define KVF_JINJA_KEYS   (1 << 17)
#define KVF_JINJA_VALUES (1 << 18)
#define KVF_JINJA_VIEW   (KVF_JINJA_ITEMS | KVF_JINJA_KEYS | KVF_JINJA_VALUES)
#define KVF_JINJA_LOOP   (1 << 19)   /* the loop object of a for */

/* A dict key that is an integer (Python's {0: 'a'}) is held as this byte and its digits;
 * kvf_jinja_key() turns a held key back into its value. */
#define KVF_JINJA_INTKEY '\x01'

/** Whether jinja2 / Python has @a name among its @a kind: "filter", "test", or the methods
 *  of "str", "list", "dict". */
bool kvf_jinja_has(const char *kind, const char *name);

/** The items iterating @a v yields, as a new list (owned): a list's, a string's characters,
 *  a dict's keys, none for undefined; NULL: @a v is not iterable (None, a number ...). */
cJSON *kvf_jinja_iter(const cJSON *v);

/** Whether @a v is a function, a macro or a method (printing one is refused: Python prints
 *  its address). */
bool kvf_jinja_is_function(const cJSON *v);

/** The value of dict key @a k as held (a number for an integer key, else a string). */
cJSON *kvf_jinja_key(const char *k);
/** The held form of key value @a key in @a buf (strings as they are, integers with
 *  KVF_JINJA_INTKEY); NULL: not a key this subset holds (a float, a list ...). */
const char *kvf_jinja_key_text(const cJSON *key, char *buf, size_t cap);

/** A new undefined value (owned; NULL on no memory, which reads as undefined too). */
cJSON *kvf_jinja_undef(void);
bool kvf_jinja_is_undef(const cJSON *v);
/** Python's truthiness; undefined and None are false. */
bool kvf_jinja_truthy(const cJSON *v);
/** Python's str() of @a v (malloc'd; undefined: ""). */
char *kvf_jinja_tostr(const cJSON *v);
/** A string value that takes over @a s (freed; NULL: ""). */
cJSON *kvf_jinja_take_str(char *s);
/* json.dumps()'s options: indent (< 0: none), ensure_ascii, sort_keys, separators. */
typedef struct {
    int         indent;
    bool        ascii;
    bool        sort_keys;
    const char *item_sep, *key_sep;   /* Python's defaults: ", " (",\n" with an indent), ": " */
} kvf_json_opts_t;

/** Python's json.dumps(v, ...) with the options of @a o appended to @a b (@a level: the
 *  nesting so far, 0 at the top). */
void kvf_jinja_json_dump(kvf_sb_t *b, const cJSON *v, const kvf_json_opts_t *o, int level);
/** @a s HTML-escaped as markupsafe does (& < > " ') appended to @a b. */
void kvf_jinja_html_escape(kvf_sb_t *b, const char *s);

/* A render's bounds (nothing a template does may hang the proxy or exhaust its memory):
 * statements run, and the size of the text or of one string built. */
#define KVF_JINJA_MAX_STEPS 5000000
#define KVF_JINJA_MAX_TEXT  (64 << 20)

/* ---- evaluation (kvf_proxy_jinja_eval.c, kvf_proxy_jinja.c) ------------------------------- */

typedef struct {
    char        *err;
    size_t       cap;
    kvf_status_t status;   /* first failure */
    char        *out;
    size_t       len, outcap;
    cJSON       *scope;    /* variables: an object; set writes here */
    const cJSON *globals;  /* the caller's variables */
    int          depth;
    time_t       now;      /* strftime_now()'s clock */
    cJSON       *loop_sets;  /* names set with 'set name' in the innermost for (Jinja scoping:
                              * they end with the loop); NULL outside loops */
    cJSON       *top;        /* the template's own scope (a macro's body sees it under its
                              * parameters) */
    int          loopctl;    /* 1: a 'break', 2: a 'continue' is unwinding to its loop */
    long         steps;      /* statements run so far (KVF_JINJA_MAX_STEPS) */
    const kvf_node_t *macros[64];   /* the macros defined so far (the last of a name wins) */
    int          nmacros;
    cJSON       *callable;   /* the value a function or macro name has (a Raw node) */
    cJSON       *namespaces; /* the namespace() objects; a namespace value is a Raw node with
                              * valueint = its index + 1 (a reference: changes through
                              * 'set ns.attr' are seen by every holder, macros included) */
} kvf_jx_t;

/** Record the first failure of a render (later ones are dropped: the first is the cause). */
void kvf_jinja_fail(kvf_jx_t *x, kvf_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** The value of @a e (owned; undefined once the render has failed or @a e is NULL). */
cJSON *kvf_jinja_eval(kvf_jx_t *x, const kvf_expr_t *e);

/** The object namespace value @a v refers to; @a v itself when it is not a namespace. */
cJSON *kvf_jinja_deref(const kvf_jx_t *x, const cJSON *v);

/** The macro named @a name defined so far, or NULL. */
const kvf_node_t *kvf_jinja_macro(const kvf_jx_t *x, const char *name);

/** Call macro @a m with the arguments of @a call (evaluated in the caller's scope); its
 *  text (owned). */
cJSON *kvf_jinja_call_macro(kvf_jx_t *x, const kvf_node_t *m, const kvf_expr_t *call);

/** A copy of @a v (owned); NULL: undefined. */
cJSON *kvf_jinja_dup(const cJSON *v);

/** Argument @a pos (positional) or @a kw (keyword) of call @a e, evaluated (owned); NULL when
 *  absent. */
cJSON *kvf_jinja_arg(kvf_jx_t *x, const kvf_expr_t *e, int pos, const char *kw);
/** A number as an integer: truncated, clamped to +-1e15 so that the conversion is defined. */
long kvf_jinja_long(double d);
/** A number's value (booleans as 0 / 1, anything else 0). */
double kvf_jinja_num(const cJSON *v);

/** The is-test @a e (its name, arguments, negation) on @a v. */
bool kvf_jinja_test(kvf_jx_t *x, const kvf_expr_t *e, const cJSON *v);
/** Python's v[lo:hi:st] of a list or string (NULL / None bounds: the defaults). */
cJSON *kvf_jinja_slice(const cJSON *v, const cJSON *lo, const cJSON *hi, const cJSON *st);

/* ---- filters (kvf_proxy_jinja_filter.c) -------------------------------------------------- */

/** The filter expression @a e (its input e->a, its name and arguments) evaluated. */
cJSON *kvf_jinja_filter(kvf_jx_t *x, const kvf_expr_t *e);

/* ---- calls and methods (kvf_proxy_jinja_call.c) ------------------------------------------ */

/** @a s without the leading (@a left) / trailing (@a right) characters of @a set. */
cJSON *kvf_jinja_strip(const char *s, const char *set, bool left, bool right);
/** @a s with every @a from replaced by @a to. */
cJSON *kvf_jinja_replace(const char *s, const char *from, const char *to);
/** @a s in lower (0), upper (1), capitalized (2), title case as Python's str.title() (3)
 *  or as jinja2's |title (4). */
cJSON *kvf_jinja_case(const char *s, int mode);
/** obj.m(args of @a call) for strings, dicts and lists. */
cJSON *kvf_jinja_method(kvf_jx_t *x, const cJSON *obj, const char *m, const kvf_expr_t *call);
/** The call @a e (a global function, a macro or a method). */
cJSON *kvf_jinja_call(kvf_jx_t *x, const kvf_expr_t *e);

#endif /* KVF_PROXY_JINJA_INT_H */
