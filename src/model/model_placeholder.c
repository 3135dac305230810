/* model module — placeholder translation unit until the module lands. */
typedef int cmf_model_placeholder;
