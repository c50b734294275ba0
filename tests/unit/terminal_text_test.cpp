// escape_for_terminal: a job's output shown by `trainyard logs` cannot drive the user's terminal.
#include "trainyard/terminal_text.h"

#include <gtest/gtest.h>

namespace trainyard {
namespace {

TEST(TerminalText, ControlCharactersBecomeVisibleEscapes) {
  // Clear the screen, set the window title, move up a line and overwrite it, ring the bell.
  EXPECT_EQ(escape_for_terminal("\x1b[2J\x1b]0;pwned\x07 up\x1b[1A\rover\x7f"),
            "\\x1b[2J\\x1b]0;pwned\\x07 up\\x1b[1A\\x0dover\\x7f");
  // C1 controls in UTF-8 (U+009B is a CSI on some terminals).
  EXPECT_EQ(escape_for_terminal("a\xc2\x9b"
                                "31mb"),
            "a\\u009b31mb");
}

TEST(TerminalText, OrdinaryTextIsUnchanged) {
  const std::string text = "[n1:0] epoch 1\tloss 0.5\nnaïve — 日本語 ✓\n";
  EXPECT_EQ(escape_for_terminal(text), text);
  EXPECT_EQ(escape_for_terminal(""), "");
}

}  // namespace
}  // namespace trainyard
