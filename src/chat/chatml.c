/*
 * chatml.c — the ChatML template used for models whose file carries no
 * chat template (docs/FORMAT.md §6): "<|im_start|>ROLE\nCONTENT<|im_end|>\n"
 * per message, then "<|im_start|>assistant\n" when add_generation_prompt.
 */
#include "cmf/chat.h"

const char *const cmf_chatml_template =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
