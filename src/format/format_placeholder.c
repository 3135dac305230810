/* format module — placeholder translation unit until the module lands. */
typedef int cmf_format_placeholder;
