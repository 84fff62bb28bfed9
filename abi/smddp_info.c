/*
 * smddp_info: prints the library version, every SMDDP_* setting, and which
 * algorithm each collective runs at each size.
 *
 *   smddp_info [--layout LxN]   L ranks per node on N nodes (default: one
 *                               per CPU, on one node and on two)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "smddp/smddp.h"

int main(int argc, char **argv)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int local = cpus > 1 ? (int)cpus : 2, nodes = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layout") && i + 1 < argc &&
            sscanf(argv[i + 1], "%dx%d", &local, &nodes) == 2 && local > 0 && nodes > 0) {
            i++;
            continue;
        }
        fprintf(stderr, "usage: smddp_info [--layout LxN]  (L ranks per node on N nodes, "
                        "both at least 1; got \"%s\")\n", argv[i]);
        return 2;
    }
    int v = smddp_get_version();
    printf("libsmddp %d.%d.%d (header %d.%d.%d)\n\n", v / 10000, v / 100 % 100, v % 100,
           SMDDP_VERSION_MAJOR, SMDDP_VERSION_MINOR, SMDDP_VERSION_PATCH);
    smddp_print_settings(stdout);
    printf("\n");
    if (nodes) {
        smddp_print_selection(stdout, local, nodes);
    } else {
        smddp_print_selection(stdout, local, 1);
        printf("\n");
        smddp_print_selection(stdout, local, 2);
    }
    return 0;
}
