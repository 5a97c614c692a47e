# e2e-failures.awk reads `go test -v` output of the e2e stories and prints,
# for each story that failed, the lines the story itself wrote (its t.Log and
# t.Error lines), leaving out the cluster's logs and the failure dump, which
# cluster_test.go writes. A CI log is read from its tail: these lines come
# last so that a failure's reason is not pushed out of it by the dump.
/^=== (RUN|CONT|NAME) / { cur = $3; next }
/^[ \t]*--- FAIL: / { order[++n] = $3; next }
/^[ \t]+[A-Za-z0-9_]+_test\.go:[0-9]+: / && !/^[ \t]+cluster_test\.go:/ {
  lines[cur] = lines[cur] $0 "\n"
}
END {
  for (i = 1; i <= n; i++) {
    t = order[i]
    if (lines[t] == "") continue
    printf "== %s said:\n%s", t, lines[t]
  }
}
