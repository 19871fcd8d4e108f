/*
 * Tokenizers: the byte-level BPE of a Hugging Face tokenizer.json (the format
 * of Nemotron-H, Qwen3 and Llama-3 checkpoints), and the plain byte tokenizer
 * (ids 0..255 are the bytes; ids >= 256 special).
 *
 * What tokenizer.json may contain (anything else is refused at load with
 * `<file>: <field> <value> is not supported`):
 *   normalizer     null
 *   pre_tokenizer  null | ByteLevel | Split (Regex or String pattern;
 *                  behavior Isolated, Removed, MergedWithPrevious,
 *                  MergedWithNext; invert false) | Sequence of these
 *   model          BPE: vocab, merges ("a b" or ["a", "b"]), byte_fallback,
 *                  unk_token, fuse_unk, ignore_merges; dropout null,
 *                  no continuing_subword_prefix / end_of_word_suffix
 *   post_processor null | ByteLevel (no tokens added)
 *   decoder        null | ByteLevel | ByteFallback | Fuse | Sequence of these
 *   added_tokens   matched in the raw text before pre-tokenization, longest
 *                  first; lstrip, rstrip and single_word must be false
 * Input that is not valid UTF-8 is read as Python's bytes.decode("utf-8",
 * "replace") reads it: each maximal invalid subsequence becomes U+FFFD.
 *
 * Thread rules: a loaded tokenizer is immutable; encode and decode may run
 * from any number of threads at once. A kvf_tokenizer_stream_t belongs to
 * one caller.
 */
#ifndef KVF_TOKENIZER_H
#define KVF_TOKENIZER_H

#include "kvf_tok_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_bpe kvf_bpe_t;

typedef struct kvf_tokenizer {
    int        vocab_size;
    int        bos_token_id;   /* -1: none */
    int        eos_token_id;   /* -1: none */
    kvf_bpe_t *bpe;            /* NULL: the byte tokenizer; else owned, see _cleanup */
} kvf_tokenizer_t;

/**
 * Byte tokenizer for @a cfg (from kvf_tok_config_load(), or the engine's
 * kvf_tok_config_of_model()). KVF_ERR_UNSUPPORTED when vocab_size < 256 (the
 * model cannot represent every byte).
 */
kvf_status_t kvf_tokenizer_init(const kvf_tok_config_t *cfg, kvf_tokenizer_t *tok_p);

/**
 * The tokenizer a model declares: `tokenizer.json` in @a model_path (a model
 * folder, or a config.json whose folder holds it). BOS/EOS ids come from
 * @a cfg (bos_token_id, eos_token_id). Byte-level models (`kvf mkmodel`)
 * declare themselves with a tokenizer.json whose vocab is the 256 bytes.
 *
 * @return KVF_OK; KVF_ERR_NOT_FOUND when there is no tokenizer.json (logged
 *         with the path); KVF_ERR_UNSUPPORTED for a feature listed above as
 *         refused (logged with the file and the field); KVF_ERR_PARSE for a
 *         malformed file. On error *tok_p is untouched.
 *         Release with kvf_tokenizer_cleanup().
 */
kvf_status_t kvf_tokenizer_load(const char *model_path, const kvf_tok_config_t *cfg,
                                kvf_tokenizer_t *tok_p);

/** Same as kvf_tokenizer_load() for the tokenizer.json at @a path; @a cfg may be NULL. */
kvf_status_t kvf_tokenizer_load_file(const char *path, const kvf_tok_config_t *cfg,
                                     kvf_tokenizer_t *tok_p);

/** Frees what kvf_tokenizer_load() allocated; safe on a byte tokenizer and twice. */
void kvf_tokenizer_cleanup(kvf_tokenizer_t *tok);

/**
 * Encode @a len bytes of @a text into @a ids (capacity @a cap), prefixed with
 * BOS when @a add_bos and the model has one.
 * @return number of ids written, or -1 when @a cap is too small (or, for
 *         BPE, when memory runs out).
 */
int kvf_tokenizer_encode(const kvf_tokenizer_t *tok, const char *text, size_t len, bool add_bos,
                         int32_t *ids, int cap);

/**
 * Decode @a n ids into @a out (capacity @a cap bytes, NUL-terminated),
 * skipping special ids and ids outside [0, vocab). BPE: invalid UTF-8 in the
 * decoded bytes becomes U+FFFD, as in Hugging Face's decode. Output is cut
 * at @a cap - 1 bytes.
 * @return bytes written, excluding the NUL.
 */
size_t kvf_tokenizer_decode(const kvf_tokenizer_t *tok, const int32_t *ids, int n, char *out,
                            size_t cap);

/** True when @a id is a special token (BOS, EOS, any added special token; byte: id >= 256). */
bool kvf_tokenizer_is_special(const kvf_tokenizer_t *tok, int32_t id);

/**
 * Raw bytes one token stands for (possibly part of a UTF-8 character),
 * written to @a buf (capacity @a cap, no NUL). Special and unknown ids give 0.
 * @return the byte count, or -1 when @a cap is too small.
 */
int kvf_tokenizer_token_bytes(const kvf_tokenizer_t *tok, int32_t id, char *buf, size_t cap);

/** Most bytes one token can stand for (a bound for kvf_tokenizer_token_bytes). */
size_t kvf_tokenizer_max_token_bytes(const kvf_tokenizer_t *tok);

/**
 * Streaming decode for server-sent events: text that is safe to send now.
 * Bytes of a UTF-8 character split across tokens are held until it is
 * complete; invalid sequences come out as U+FFFD. The concatenation of every
 * feed and the final flush equals kvf_tokenizer_decode() of all the ids.
 * A run of byte-fallback tokens (<0xNN>) is held until it ends, since the
 * library decodes it as a whole (valid UTF-8, or one U+FFFD per token); a run
 * longer than KVF_TOKENIZER_STREAM_PEND bytes is decided in pieces.
 * Zero-initialise before the first feed.
 */
#define KVF_TOKENIZER_STREAM_PEND 64

typedef struct kvf_tokenizer_stream {
    unsigned char pend[KVF_TOKENIZER_STREAM_PEND];  /* held bytes */
    int           npend;
    int           nrun;   /* > 0: pend is a run of this many byte-fallback tokens */
} kvf_tokenizer_stream_t;

/** Output bytes kvf_tokenizer_stream_feed() may need for @a n ids (plus the NUL). */
size_t kvf_tokenizer_stream_cap(const kvf_tokenizer_t *tok, int n);

/**
 * Feed @a n ids; writes the complete text to @a out (NUL-terminated; @a cap
 * >= kvf_tokenizer_stream_cap(tok, n)). @return bytes written.
 */
size_t kvf_tokenizer_stream_feed(const kvf_tokenizer_t *tok, kvf_tokenizer_stream_t *s,
                                 const int32_t *ids, int n, char *out, size_t cap);

/**
 * End of stream: held bytes come out (as U+FFFD when incomplete); @a cap >=
 * 3 * KVF_TOKENIZER_STREAM_PEND + 1. @return bytes written.
 */
size_t kvf_tokenizer_stream_flush(kvf_tokenizer_stream_t *s, char *out, size_t cap);

#endif
