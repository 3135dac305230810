# embed_page.cmake — turn src/server/chat.html into a C array (the chat page
# served at /), run at build time: cmake -DIN=chat.html -DOUT=chat_page.c -P embed_page.cmake
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE ${OUT} "/* chat_page.c — generated from src/server/chat.html by embed_page.cmake; do not edit. */\n#include <stddef.h>\nconst unsigned char cmf_server_chat_page[] = {\n${body}0x00};\nconst size_t cmf_server_chat_page_len = ${bytes};\n")
