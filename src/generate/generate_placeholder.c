/* generate module — placeholder translation unit until the module lands. */
typedef int cmf_generate_placeholder;
