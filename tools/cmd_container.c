/* cmd_container.c — placeholder; replaced by its module's owner. */
#include "cli.h"
#include <stdio.h>
int cmd_info(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
int cmd_verify(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
int cmd_sign(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
int cmd_keygen(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
int cmd_compact(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
