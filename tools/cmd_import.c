/* cmd_import.c — placeholder; replaced by its module's owner. */
#include "cli.h"
#include <stdio.h>
int cmd_convert(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
int cmd_import_gguf(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
int cmd_import_llama2c(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
