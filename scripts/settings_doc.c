/* gs-settings-doc: prints the configuration table of docs/operator-guide.md
 * from the settings table (common/settings.c). `gs-settings-doc server`
 * prints gradsyncd's flags and environment, `gs-settings-doc worker` the
 * worker library's environment. scripts/settings-doc.sh puts them into the
 * docs (--write) or checks that the docs match (--check, a ctest test). */
#include <stdio.h>
#include <string.h>

#include "settings.h"

int main(int argc, char **argv) {
  if (argc != 2 || (strcmp(argv[1], "server") != 0 && strcmp(argv[1], "worker") != 0)) {
    fprintf(stderr, "usage: gs-settings-doc server|worker\n");
    return 2;
  }
  gs__settings_markdown(stdout, strcmp(argv[1], "server") == 0 ? GS__FOR_SERVER : GS__FOR_WORKER);
  return 0;
}
