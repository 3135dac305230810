/* import module — placeholder translation unit until the module lands. */
typedef int cmf_import_placeholder;
