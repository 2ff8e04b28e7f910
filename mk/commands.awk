# commands.awk: the programs a bash script runs, one per line, from the
# script as `declare -f` prints it (one command per line, no comments).
# A word counts when it begins a command (outside quotes, heredoc bodies,
# arithmetic, arrays and case patterns), or is what a wrapper runs:
# timeout, command -v, and tests/integration/lib.sh's start and check.
# Used by mk/check-deps.sh.

  function emit(w) {
    if (w ~ /^[A-Za-z][A-Za-z0-9_.+-]*$/) print w
  }
  # a word ended at a separator: is it a command (or a wrapper)?
  function take(w) {
    if (w == "" || inarray) return
    if (w == "esac") { incase = 0; start = 0; return }
    if (incase == 2) return  # a case pattern
    if (start) {
      if (w ~ /^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=/ || w ~ /^[0-9]*[<>]/) return
      if (w ~ /^(if|then|else|elif|do|while|until|time|exec|nohup|env|sudo|stdbuf|setsid|nice|xargs)$/) return
      start = 0
      if (w == "timeout") wrap = 2
      else if (w == "command") wrap = 1
      else if (w == "start" || w == "check") wrap = 2
      else if (w == "case") incase = 3
      else if (w !~ /^(for|select|function|in|done|fi|esac|declare|local|export|readonly|\[\[|\[)$/) emit(w)
      return
    }
    if (incase == 3 && w == "in") { incase = 2; return }
    if (wrap > 0 && w !~ /^-/) {
      if (wrap == 2 && w ~ /^[0-9.]+[smhd]?$/) { wrap = 1; return }   # timeout N
      if (--wrap == 0) emit(w)
    }
  }
  { text = text $0 "\n" }
  END {
    n = length(text); i = 1; start = 1; sq = 0; dq = 0; word = ""; hd = ""; incase = 0
    while (i <= n) {
      c = substr(text, i, 1)
      if (sq) { if (c == "\047") sq = 0; i++; continue }
      if (c == "\\") { word = word substr(text, i, 2); i += 2; continue }
      if (dq) {
        if (c == "\"") { dq = 0; i++; continue }
        if (substr(text, i, 2) == "$(" && substr(text, i, 3) != "$((") {
          take(word); word = ""; start = 1; dq = 0; push[++sp] = 1; i += 2; continue
        }
        i++; continue
      }
      # $(( )) and (( )): arithmetic, no command in it
      if (substr(text, i, 3) == "$((" || (start && word == "" && substr(text, i, 2) == "((")) {
        depth = 0; if (c == "$") i++
        while (i <= n) {
          ch = substr(text, i, 1)
          if (ch == "(") depth++
          else if (ch == ")" && --depth == 0) break
          i++
        }
        word = word "0"; i++; continue
      }
      # ${...}: a parameter expansion, part of the word
      if (substr(text, i, 2) == "${") {
        depth = 0
        while (i <= n) {
          ch = substr(text, i, 1); word = word ch
          if (ch == "{") depth++
          else if (ch == "}" && --depth == 0) break
          i++
        }
        i++; continue
      }
      # NAME=( ... ): an array, no command in it
      if (c == "(" && word ~ /^[A-Za-z_][A-Za-z0-9_]*\+?=$/) {
        inarray = 1; word = ""; i++; continue
      }
      if (c == ")" && inarray) { inarray = 0; word = ""; start = 0; i++; continue }
      # { and } group commands only as words of their own ({fd}<> is a word)
      if ((c == "{" && substr(text, i + 1, 1) !~ /[ \t\n]/) || (c == "}" && word != "")) {
        word = word c; i++; continue
      }
      if (c == "\047") { sq = 1; word = word "\047"; i++; continue }
      if (c == "\"") { dq = 1; word = word "\""; i++; continue }
      if (substr(text, i, 2) == "<<" && substr(text, i, 3) != "<<<") {
        rest = substr(text, i + 2); sub(/^-/, "", rest); sub(/^[ \t]*/, "", rest)
        if (match(rest, /^[\047"]?[A-Za-z_][A-Za-z0-9_]*/)) {
          hd = substr(rest, 1, RLENGTH); gsub(/[\047"]/, "", hd)
        }
        i += 2; continue
      }
      if (c == "\n" && hd != "") {
        # the heredoc body: up to a line that is the delimiter
        take(word); word = ""; i++
        while (i <= n) {
          e = index(substr(text, i), "\n"); l = substr(text, i, e - 1); i += e
          sub(/^[\t]+/, "", l)
          if (l == hd) break
        }
        hd = ""; start = 1; continue
      }
      if (c ~ /[ \t\n;|&()`{}!]/) {
        take(word); word = ""
        if (c == ";" && substr(text, i, 2) == ";;") { if (incase) incase = 2; i += 2; start = 1; continue }
        if (c == ")" && incase == 2) { incase = 1; start = 1; i++; continue }  # pattern done
        if (c == ")" && sp > 0 && push[sp]) { sp--; dq = 1; i++; continue }
        if (c == "(" && substr(text, i - 1, 1) == "$") { push[++sp] = 0 }
        else if (c == ")" && sp > 0) sp--
        if (c ~ /[;|&(`{!\n]/) { start = 1; wrap = 0 }
        i++; continue
      }
      if (c == "$" && substr(text, i, 2) == "$(") { take(word); word = ""; start = 1; push[++sp] = 0; i += 2; continue }
      word = word c; i++
    }
    take(word)
  }
