// Text from elsewhere (a job's output, a remote's message) made safe to write to a terminal: its
// control characters written as visible escapes, so that a job's output cannot move the cursor,
// retitle the window, rewrite lines already shown or hide text. LibTorch-free.
#pragma once

#include <string>
#include <string_view>

namespace trainyard {

// `text` with every C0 control character but newline and tab, DEL, and the C1 controls (UTF-8
// U+0080..U+009F) written as "\xNN" (C1: "\u0080".."\u009f"); everything else unchanged.
std::string escape_for_terminal(std::string_view text);

}  // namespace trainyard
