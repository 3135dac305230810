/* sample module — placeholder translation unit until the module lands. */
typedef int cmf_sample_placeholder;
