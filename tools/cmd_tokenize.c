/* cmd_tokenize.c — placeholder; replaced by its module's owner. */
#include "cli.h"
#include <stdio.h>
int cmd_tokenize(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
int cmd_detokenize(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
