// Document masking (data.document_mask): a packed sequence holds several documents, and each
// token attends only to the tokens of its own document before it. A document begins at each
// `separator` token (the data's end-of-document token: it ends one document as the last target of
// its text and opens the next one's context, as a beginning-of-sequence token would), and at the
// sequence's first token. With restart_positions each document counts its positions from 0 (the
// position table, the rotary angles), so a document reads as if it began the sequence.
#pragma once

namespace pipetrain {

struct DocumentMask {
  int separator = -1;  // -1: no masking, one context per sequence
  bool restart_positions = false;
  bool on() const { return separator >= 0; }
};

// For the n tokens of one sequence at positions offset .. offset + n - 1: start[i], the position
// token i's document begins at (`open`, the document still open before them, until a separator),
// and pos[i], its position (offset + i - start[i] with restart_positions, else offset + i).
// Returns the document open after them.
int find_documents(const int* tokens, int n, int offset, int open, const DocumentMask& mask, int* start, int* pos);

}  // namespace pipetrain
