#!/usr/bin/env bash
# OTP 25.2.3's own Mnesia test suite (lib/mnesia/test, driven by its `mt`
# module) run with Heft standing in for the suite's test backend: the
# suite's `ext_test` module is replaced by heft_mnesia, its alias
# `ext_ets` mapped to heft_ram_copies and `ext_dets` to heft_copies
# (heft's mnesia_aliases env, passed to every node through ERL_AFLAGS).
# Not part of bin/test: it fetches Debian's source package of erlang.
#
#   test/otp_mnesia/run.sh [CASE]      CASE as for mt:t/1 (default: dirty),
#                                      e.g. trans, durability, evil, light,
#                                      '{mnesia_dirty_access_test, dirty_write_xets}'
#   test/otp_mnesia/run.sh --disc-only-as-heft [CASE]
#                                      the same, with every disc_only_copies of
#                                      the access (dirty, trans), transaction
#                                      (atomicity, isolation), durability,
#                                      recovery, consistency and backup
#                                      suites (and of mnesia_test_lib's
#                                      checks) rewritten to heft_copies, which
#                                      the suite's schemas then register
#
# OTP_SRC=<an unpacked OTP 25.2.3 source tree> uses its lib/mnesia/test
# instead of fetching Debian's source package.
#
# Needs a deb-src line for bookworm main (see docs/mnesia.md). Work files
# go to tmp/otp_mnesia/ (the suite is unpacked afresh each run; the
# source tarball is kept).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
map_disc_only=
if [ "${1:-}" = --disc-only-as-heft ]; then map_disc_only=1; shift; fi
case_=${1:-dirty}
work=$root/tmp/otp_mnesia
mkdir -p "$work"

rm -rf "$work/suite" "$work/unpack"
if [ -n "${OTP_SRC:-}" ]; then
  cp -r "$OTP_SRC/lib/mnesia/test" "$work/suite"
else
  tarball=$(ls "$work"/erlang_25.2.3*.orig.tar.xz 2>/dev/null | head -1 || true)
  if [ -z "$tarball" ]; then
    (cd "$work" && apt-get source --download-only erlang)
    tarball=$(ls "$work"/erlang_25.2.3*.orig.tar.xz | head -1)
  fi
  mkdir -p "$work/unpack"
  tar -xJf "$tarball" -C "$work/unpack" --wildcards '*/lib/mnesia/test/*'
  mv "$work"/unpack/*/lib/mnesia/test "$work/suite"
  rm -rf "$work/unpack"
fi
rm -f "$work/suite/ext_test.erl"
sed -i 's/\bext_test\b/heft_mnesia/g' "$work"/suite/*.erl "$work"/suite/*.hrl
if [ -n "$map_disc_only" ]; then
  (cd "$work/suite" &&
    sed -i 's/\bdisc_only_copies\b/heft_copies/g' mnesia_dirty_access_test.erl \
      mnesia_trans_access_test.erl mnesia_atomicity_test.erl mnesia_isolation_test.erl \
      mnesia_durability_test.erl mnesia_recovery_test.erl mnesia_consistency_test.erl \
      mnesia_evil_backup.erl mnesia_test_lib.erl &&
    sed -i 's/{ext_dets, heft_mnesia}\]/{ext_dets, heft_mnesia}, {heft_copies, heft_mnesia}]/' \
      mnesia_test_lib.hrl &&
    grep -q '{heft_copies, heft_mnesia}' mnesia_test_lib.hrl)
fi

source bin/ensure-deps >/dev/null
MIX_ENV=test mix compile >/dev/null
(cd "$work/suite" && erlc *.erl)

paths=()
for d in "$root"/_build/test/lib/*/ebin; do paths+=(-pa "$d"); done
elixir_lib=$(elixir -e 'IO.write(:code.lib_dir(:elixir))')
paths+=(-pa "$elixir_lib/ebin")

export ERL_AFLAGS="-heft mnesia_aliases [{ext_ets,heft_ram_copies},{ext_dets,heft_copies}]"
cd "$work/suite"
# mt:t/1 answers a tree: {Seconds, {Group, [Subtree]}} for a group,
# {Seconds, {ok | failed | skip | crash, {Mod, Fun}, _}} for a case.
exec erl -sname a "${paths[@]}" -pa . -mnesia_test_timeout -noshell -eval "
  Leaves = fun L(X) when is_list(X) -> lists:flatmap(L, X);
               L({_, {_, Sub}}) when is_list(Sub) -> L(Sub);
               L({_, R}) when tuple_size(R) =:= 3 -> [R];
               L(_) -> [] end,
  Rs = Leaves(mt:t($case_)),
  N = fun(K) -> length([x || R <- Rs, element(1, R) =:= K]) end,
  io:format(\"~nheft otp_mnesia $case_: ~p cases: ~p ok, ~p failed, ~p crashed, ~p skipped~n\",
            [length(Rs), N(ok), N(failed), N(crash), N(skip)]),
  [io:format(\"  ~p ~p~n\", [element(1, R), element(2, R)]) || R <- Rs, element(1, R) =/= ok],
  halt()."
