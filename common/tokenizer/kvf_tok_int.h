/*
 * Internal to the tokenizer (kvf_tokenizer.c: maps, UTF-8, decoding;
 * kvf_tok_load.c: tokenizer.json; kvf_tok_encode.c: encoding): the loaded
 * BPE and the helpers the parts share. kvf_tokenizer.c's opening comment
 * describes the design.
 */
#ifndef KVF_TOK_INT_H
#define KVF_TOK_INT_H


#define PCRE2_CODE_UNIT_WIDTH 8
#include "kvf_tokenizer.h"
#include "kvf_log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
/* ---- string -> id map (open addressing) ------------------------------------------ */

typedef struct {
    const char *key;     /* points into kvf_bpe_t.tokens; NULL: empty slot */
    uint32_t    len;
    int32_t     id;
} kvf_str_slot_t;

typedef struct {
    kvf_str_slot_t *slots;
    size_t          mask;
} kvf_str_map_t;

/* ---- (left, right) -> merge map --------------------------------------------------- */

typedef struct {
    uint64_t key;        /* (left << 32 | right) + 1; 0: empty */
    int32_t  rank;
    int32_t  merged;
} kvf_pair_slot_t;

typedef struct {
    kvf_pair_slot_t *slots;
    size_t           mask;
} kvf_pair_map_t;

/* ---- the loaded tokenizer --------------------------------------------------------- */

typedef enum {
    KVF_PRE_SPLIT = 1,
    KVF_PRE_BYTELEVEL,
} kvf_pre_kind_t;

typedef enum {
    KVF_SPLIT_ISOLATED = 1,
    KVF_SPLIT_REMOVED,
    KVF_SPLIT_MERGED_PREV,
    KVF_SPLIT_MERGED_NEXT,
} kvf_split_behavior_t;

typedef struct {
    kvf_pre_kind_t       kind;
    pcre2_code          *re;             /* Split, or ByteLevel with use_regex */
    kvf_split_behavior_t behavior;
    bool                 add_prefix_space;
} kvf_pre_step_t;

#define KVF_TOK_MAX_PRE 8

typedef struct {
    char   *content;
    size_t  len;
    int32_t id;
    bool    special;
    bool    normalized;
} kvf_added_t;

struct kvf_bpe {
    int32_t         vocab_size;       /* max id + 1 over vocab and added tokens */
    char          **tokens;           /* [vocab_size]: vocab string (NUL-terminated) or NULL */
    uint32_t       *token_len;
    kvf_str_map_t   vocab;
    kvf_pair_map_t  merges;
    kvf_added_t    *added;
    int             num_added;
    int32_t        *added_of_id;      /* [vocab_size]: index in added or -1 */
    kvf_pre_step_t  pre[KVF_TOK_MAX_PRE];
    int             num_pre;
    bool            byte_fallback;
    bool            ignore_merges;
    bool            fuse_unk;
    int32_t         unk_id;           /* -1: none */
    bool            dec_bytelevel;
    bool            dec_byte_fallback;
    int32_t         byte_ids[256];    /* ByteLevel: id of each byte's stand-in, -1 none */
    size_t          max_token_bytes;
};


/* ---- kvf_tokenizer.c ---- */

/*
 * One UTF-8 sequence at p (n > 0 bytes available). Returns 1 for a valid
 * character of *len_p bytes, 0 for an invalid maximal subpart of *len_p bytes
 * (one U+FFFD), -1 when the bytes are a valid but incomplete prefix that runs
 * to the end of the input (*len_p = n).
 */
int kvf_utf8_seq(const unsigned char *p, size_t n, size_t *len_p);

/*
 * Lossy copy of [p, p+n) into out (capacity >= 3n+1). When hold is set, an
 * incomplete trailing sequence is not written and its length is returned in
 * *held_p. Returns bytes written (no NUL).
 */
size_t kvf_utf8_lossy(const unsigned char *p, size_t n, bool hold, char *out, size_t *held_p);

/* UTF-8 of code point @a cp into @a out (4 bytes room). Returns its length. */
size_t kvf_utf8_encode(uint32_t cp, char *out);

/* An empty map with room for @a n keys (load <= 1/2). KVF_ERR_NO_MEMORY. */
kvf_status_t kvf_str_map_init(kvf_str_map_t *m, size_t n);

/* Insert; returns false when the key is already present. */
bool kvf_str_map_put(kvf_str_map_t *m, const char *key, size_t len, int32_t id);

/* The id of @a key, -1 when absent. */
int32_t kvf_str_map_get(const kvf_str_map_t *m, const char *key, size_t len);

/* The merge map key of (@a l, @a r); never 0. */
uint64_t kvf_pair_key(int32_t l, int32_t r);

/* Slot hash of a pair key. */
size_t kvf_pair_hash(uint64_t k);

/* The merge of (@a l, @a r), NULL when the pair does not merge. */
const kvf_pair_slot_t *kvf_pair_get(const kvf_pair_map_t *m, int32_t l, int32_t r);

/* Fill kvf_byte_cp and kvf_cp_byte (idempotent). */
void kvf_bytelevel_tables(void);

/* Free a loaded BPE and everything it owns (NULL: nothing). */
void kvf_bpe_free(kvf_bpe_t *b);

/* GPT-2 bytes_to_unicode: printable bytes stand for themselves, the rest for 256 + n
 * (filled by kvf_bytelevel_tables). */
extern uint32_t kvf_byte_cp[256];
extern int16_t  kvf_cp_byte[324];

#endif
