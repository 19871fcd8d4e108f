/* Keeps a layer library non-empty while its folder is being filled. */
typedef int kvf_empty_translation_unit_t;
