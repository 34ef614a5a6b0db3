#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
    int sleep_between = argc > 1;
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { printf("no permission\n"); return 3; }
    unsigned char cfg[64]; memset(cfg, 0, 64);
    cfg[0] = 1;                       /* palette 1 */
    for (int t = 0; t < 8; t++) { cfg[16 + 2*t] = 64; cfg[48 + t] = 16; }
    for (int i = 0; i < 200; i++) {
        __asm__ volatile("ldtilecfg %0" :: "m"(cfg));
        if (sleep_between) usleep(1000);
        __asm__ volatile("tilezero %%tmm4" ::: "memory");
        __asm__ volatile("tilerelease" ::: "memory");
    }
    printf("ok\n"); return 0;
}
