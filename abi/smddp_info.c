/* smddp_info: prints the library version and every SMDDP_* setting. */
#include <stdio.h>

#include "smddp/smddp.h"

int main(void)
{
    int v = smddp_get_version();
    printf("libsmddp %d.%d.%d (header %d.%d.%d)\n\n", v / 10000, v / 100 % 100, v % 100,
           SMDDP_VERSION_MAJOR, SMDDP_VERSION_MINOR, SMDDP_VERSION_PATCH);
    smddp_print_settings(stdout);
    return 0;
}
