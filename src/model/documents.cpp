#include "pipetrain/model/documents.hpp"

namespace pipetrain {

int find_documents(const int* tokens, int n, int offset, int open, const DocumentMask& mask, int* start, int* pos) {
  for (int i = 0; i < n; ++i) {
    if (tokens[i] == mask.separator) open = offset + i;
    start[i] = open;
    pos[i] = mask.restart_positions ? offset + i - open : offset + i;
  }
  return open;
}

}  // namespace pipetrain
