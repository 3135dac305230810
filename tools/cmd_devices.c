/*
 * cmd_devices.c — `cmf devices`: the devices this build can run models on
 * (cmf_device_list): the spec to pass as --device, the name, device-local
 * memory, subgroup size, and whether VK_KHR_cooperative_matrix and integer
 * dot products are present. `--json` prints the same as one JSON array.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const char devices_help[] =
    "usage: cmf devices [--json]\n"
    "  Lists the devices --device accepts: cpu, then every Vulkan physical device\n"
    "  (name, device-local memory, subgroup size, cooperative-matrix and\n"
    "  integer-dot support). No Vulkan driver: only cpu is listed.\n";

int cmd_devices(int argc, char **argv) {
    const char *cmd = "devices";
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) { fputs(devices_help, stdout); return CLI_EXIT_OK; }
        if (strcmp(argv[i], "--json") == 0) json = true;
        else return cli_usage_error(cmd, "unexpected argument %s", argv[i]);
    }
    cmf_device_info d[17];
    size_t n = 0;
    cmf_error err = {0};
    if (cmf_device_list(d, 17, &n, &err) != CMF_OK) {
        cli_fail(cmd, &err);
        return CLI_EXIT_FAIL;
    }
    if (n > 17) n = 17;
    if (json) fputs("[", stdout);
    else printf("%-10s %-40s %10s %8s %8s %8s\n", "device", "name", "memory", "subgroup", "coopmat", "int-dot");
    for (size_t i = 0; i < n; i++) {
        if (json) {
            printf("%s\n  {\"device\": \"%s\", \"name\": \"%s\", \"api\": \"%s\", \"memory_bytes\": %llu, "
                   "\"subgroup\": %u, \"coopmat\": %s, \"int_dot\": %s}",
                   i ? "," : "", d[i].spec, d[i].name, d[i].api, (unsigned long long)d[i].memory, d[i].subgroup,
                   d[i].coopmat ? "true" : "false", d[i].int_dot ? "true" : "false");
            continue;
        }
        char mem[32] = "host";
        if (d[i].memory) snprintf(mem, sizeof mem, "%.1f GiB", d[i].memory / 1073741824.0);
        char sg[16] = "-";
        if (d[i].subgroup) snprintf(sg, sizeof sg, "%u", d[i].subgroup);
        bool gpu = strcmp(d[i].spec, "cpu") != 0;
        printf("%-10s %-40.40s %10s %8s %8s %8s\n", d[i].spec, d[i].name, mem, sg,
               gpu ? (d[i].coopmat ? "yes" : "no") : "-", gpu ? (d[i].int_dot ? "yes" : "no") : "-");
    }
    if (json) fputs("\n]\n", stdout);
    return CLI_EXIT_OK;
}
