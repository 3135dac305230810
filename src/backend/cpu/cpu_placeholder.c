/* cpu module — placeholder translation unit until the module lands. */
typedef int cmf_cpu_placeholder;
