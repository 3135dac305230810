/* chat module — placeholder translation unit until the module lands. */
typedef int cmf_chat_placeholder;
