/* The source of corpus/plugin_file/tiny.so, the smallest real shared library the ELF check
 * accepts (4.8 KB), built with:
 *   gcc -shared -nostdlib -fPIC -Os -s -Wl,--build-id=none -Wl,-z,max-page-size=0x1000 \
 *       -Wl,-z,noseparate-code -o corpus/plugin_file/tiny.so tiny_seed.c
 * tiny-truncated.so is its first 1000 bytes (segments past the end: refused). */
int kvrt_fuzz_seed(void) { return 7; }
