// The text `data prepare` reads: plain text, gzip-compressed text (.gz, read as it decompresses),
// and JSON Lines (.jsonl, .jsonl.gz: one JSON object per line, its `text` field one document), in
// blocks cut at line ends (a JSON record is never cut), each block saying where documents end in it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/config/choices.hpp"

namespace pipetrain {

// DocumentSplit (choices.hpp): how plain text is cut into documents: not at all (the inputs run
// on), at each file's end, or also after each paragraph's blank lines. JSON Lines records are
// documents whatever it says.

// Whether `path` is read as JSON Lines (its name ends .jsonl or .jsonl.gz).
bool is_jsonl(const std::string& path);

// The inputs a list of --input values names: each a file, a glob ("shards/*.jsonl.gz", its matches
// sorted) or a folder (its files, sorted); SpecError naming a value that names nothing.
std::vector<std::string> expand_inputs(const std::vector<std::string>& given);

struct TextBlock {
  std::string text;
  std::vector<size_t> ends;  // offsets in text where a document ends, ascending
};

class TextInput {
 public:
  // SpecError naming the file if it cannot be opened.
  TextInput(const std::string& path, DocumentSplit split);
  ~TextInput();
  TextInput(const TextInput&) = delete;
  TextInput& operator=(const TextInput&) = delete;
  // The next block of about `bytes` of text (more where a line or record is longer), false at the
  // end. A record that is not a JSON object with a string `text` is a SpecError naming file:line.
  bool next(TextBlock& block, size_t bytes);
  uint64_t bytes_read() const;  // of the file itself (compressed bytes of a .gz), for progress

 private:
  bool read_more(size_t bytes);  // appends up to `bytes` of the file to pending_; false at its end
  void next_text(TextBlock& block, size_t bytes);
  void next_records(TextBlock& block, size_t bytes);
  std::string path_;
  DocumentSplit split_;
  bool jsonl_;
  void* gz_ = nullptr;   // gzFile: reads plain files as they are
  std::string pending_;  // read, not yet handed out
  bool eof_ = false, ended_ = false;
  bool content_ = false;           // text other than line ends in this file so far
  bool after_newline_ = false;     // the last character handed out was a line end
  bool blank_after_text_ = false;  // a blank line has followed text: the next text begins a paragraph
  uint64_t line_ = 0;              // JSON Lines: records handed out
};

}  // namespace pipetrain
