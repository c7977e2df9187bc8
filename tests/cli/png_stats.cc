// png_stats FILE [#rrggbb ...]: what a screenshot shows, for the HTML report's browser test.
// Prints "size W H", "nonwhite N" (pixels not near-white) and "color #rrggbb N" for each colour
// asked (pixels within a small distance of it: anti-aliasing shifts edges, not fills).
#include <png.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: png_stats FILE [#rrggbb ...]\n");
    return 2;
  }
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (png_image_begin_read_from_file(&image, argv[1]) == 0) {
    std::fprintf(stderr, "png_stats: %s: %s\n", argv[1], image.message);
    return 1;
  }
  image.format = PNG_FORMAT_RGB;
  std::vector<unsigned char> pixels(PNG_IMAGE_SIZE(image));
  if (png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr) == 0) {
    std::fprintf(stderr, "png_stats: %s: %s\n", argv[1], image.message);
    return 1;
  }
  struct Wanted {
    std::string name;
    int r, g, b;
    long count = 0;
  };
  std::vector<Wanted> wanted;
  for (int i = 2; i < argc; ++i) {
    const std::string hex = argv[i];
    if (hex.size() != 7 || hex[0] != '#') {
      std::fprintf(stderr, "png_stats: %s: expected #rrggbb\n", argv[i]);
      return 2;
    }
    const long v = std::strtol(hex.c_str() + 1, nullptr, 16);
    wanted.push_back({hex, static_cast<int>((v >> 16) & 255), static_cast<int>((v >> 8) & 255),
                      static_cast<int>(v & 255)});
  }
  long nonwhite = 0;
  for (size_t i = 0; i + 2 < pixels.size(); i += 3) {
    const int r = pixels[i], g = pixels[i + 1], b = pixels[i + 2];
    if (r < 235 || g < 235 || b < 235) ++nonwhite;
    for (Wanted& w : wanted) {
      if (std::abs(r - w.r) + std::abs(g - w.g) + std::abs(b - w.b) <= 24) ++w.count;
    }
  }
  std::printf("size %u %u\nnonwhite %ld\n", image.width, image.height, nonwhite);
  for (const Wanted& w : wanted) std::printf("color %s %ld\n", w.name.c_str(), w.count);
  return 0;
}
