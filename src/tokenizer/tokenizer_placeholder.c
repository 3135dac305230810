/* tokenizer module — placeholder translation unit until the module lands. */
typedef int cmf_tokenizer_placeholder;
