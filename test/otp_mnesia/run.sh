#!/usr/bin/env bash
# The running OTP release's own Mnesia test suite (lib/mnesia/test, driven
# by its `mt` module) run with Heft standing in for the suite's test backend: the
# suite's `ext_test` module is replaced by heft_mnesia, its aliases
# (`ext_ets` and `ext_dets`, from OTP 27 `ext_ram_copies` and
# `ext_disc_only_copies`) mapped to heft_ram_copies and heft_copies
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
# OTP_SRC=<an unpacked OTP source tree of the running release> uses its
# lib/mnesia/test instead of a source package. Otherwise the release's
# tarball is taken from tmp/otp_mnesia/, then from
# $HEFT_OTP_CACHE/src/<release>/ (default /var/cache/heft-otp, where
# bin/test-otp keeps them and mounts them into its chroots), then fetched
# with `apt-get source` (a deb-src line for the Debian suite the release
# comes from: see docs/mnesia.md). On OTP 27 or 29:
#   bin/test-otp 29 -- test/otp_mnesia/run.sh trans
# Work files go to tmp/otp_mnesia/ (the suite is unpacked afresh each
# run; a fetched tarball is kept).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
map_disc_only=
if [ "${1:-}" = --disc-only-as-heft ]; then map_disc_only=1; shift; fi
case_=${1:-dirty}
work=$root/tmp/otp_mnesia
mkdir -p "$work"

source bin/ensure-deps >/dev/null
release=$(erl -noshell -eval 'io:format("~s", [erlang:system_info(otp_release)]), halt().')
rm -rf "$work/suite" "$work/unpack"
if [ -n "${OTP_SRC:-}" ]; then
  cp -r "$OTP_SRC/lib/mnesia/test" "$work/suite"
else
  src_cache=${HEFT_OTP_CACHE:-/var/cache/heft-otp}/src/$release
  find_tarball() {
    ls "$work"/erlang_"$release".*.orig.tar.xz "$src_cache"/erlang_"$release".*.orig.tar.xz \
      2>/dev/null | head -1 || true
  }
  tarball=$(find_tarball)
  if [ -z "$tarball" ]; then
    (cd "$work" && apt-get source --download-only erlang)
    tarball=$(find_tarball)
    [ -n "$tarball" ] || { echo "no OTP $release source package found" >&2; exit 1; }
  fi
  echo "OTP $release's Mnesia suite from $(basename "$tarball")"
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
    sed -i 's/\({ext_\(dets\|disc_only_copies\), heft_mnesia}\)\]/\1, {heft_copies, heft_mnesia}]/' \
      mnesia_test_lib.hrl &&
    grep -q '{heft_copies, heft_mnesia}' mnesia_test_lib.hrl)
fi

MIX_ENV=test mix compile >/dev/null
(cd "$work/suite" && erlc *.erl)

paths=()
for d in "$root"/_build/test/lib/*/ebin; do paths+=(-pa "$d"); done
elixir_lib=$(elixir -e 'IO.write(:code.lib_dir(:elixir))')
paths+=(-pa "$elixir_lib/ebin")

# The suite's backend aliases: ext_ets and ext_dets up to OTP 26,
# ext_ram_copies and ext_disc_only_copies from OTP 27 on.
aliases="{ext_ets,heft_ram_copies},{ext_dets,heft_copies}"
aliases="$aliases,{ext_ram_copies,heft_ram_copies},{ext_disc_only_copies,heft_copies}"
export ERL_AFLAGS="-heft mnesia_aliases [$aliases]"
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
