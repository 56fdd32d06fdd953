#!/usr/bin/env bash
# OTP's own ETS test suite (lib/stdlib/test/ets_SUITE.erl) of the running
# VM's release, run twice with common_test: once as it is, against ETS (the
# baseline: which cases pass on this VM), and once with its calls of `ets`
# sent to Heft through test/otp_ets/heft_ets_shim.erl. Prints each case as
#
#   pass      passes on ETS and on Heft
#   HEFT      passes on ETS, fails (or is skipped) on Heft, with the reason
#   both      fails on ETS and on Heft
#   ets-only  fails on ETS, passes on Heft
#   skipped   skipped on ETS
#
# and a summary line. Not part of bin/test. See test/otp_ets/README.md.
#
#   test/otp_ets/run.sh [CASE|GROUP...]   every case (default) or these
#   test/otp_ets/run.sh --heft [CASE...]  Heft only; the baseline of the
#                                         last full run is kept
#   test/otp_ets/run.sh --ets [CASE...]   the baseline only
#   test/otp_ets/run.sh --report          the last runs' comparison again
#
# The suite comes from the Debian source package of the running release,
# in this order: OTP_SRC=<an unpacked OTP source tree>;
# OTP_TARBALL=<an erlang_*.orig.tar.xz>; $HEFT_OTP_SRC/<release>/ (default
# /var/cache/heft-otp/src, which bin/test-otp mounts into its chroots);
# tmp/otp_ets/<release>/; else `apt-get source --download-only erlang`
# (needs a deb-src line for the release's Debian suite). The tarball must
# be of the running major release. Its suite and erts_test_utils.erl are
# unpacked afresh into tmp/otp_ets/<release>/ on each run, never into the
# tree. OTP_ETS_CT_OPTS=<an Erlang list> adds options to ct:run_test/1,
# e.g. '[{multiply_timetraps, 0.2}]'.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
here=$root/test/otp_ets

sides=(ets heft)
report_only=
case "${1:-}" in
  --heft) sides=(heft); shift ;;
  --ets) sides=(ets); shift ;;
  --report) report_only=1; shift ;;
esac

erl_eval() { erl -noshell -eval "$1" -s init stop; }
release=$(erl_eval 'io:put_chars(erlang:system_info(otp_release)).')
version=$(erl_eval '{ok, V} = file:read_file(filename:join([code:root_dir(), "releases",
  erlang:system_info(otp_release), "OTP_VERSION"])), io:put_chars(string:trim(V)).')
work=$root/tmp/otp_ets/$release
mkdir -p "$work"

if [ -z "$report_only" ]; then
  ct_ebin=$(erl_eval 'io:put_chars(code:lib_dir(common_test)).' 2>/dev/null || true)
  if [ ! -d "$ct_ebin/ebin" ]; then
    echo "Installing erlang-common-test (Debian's package of common_test)..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q erlang-common-test >/dev/null
  fi

  # The suite's sources, from the release's Debian source package.
  src=$work/src
  rm -rf "$src"
  mkdir -p "$src"
  if [ -n "${OTP_SRC:-}" ]; then
    cp -r "$OTP_SRC/lib/stdlib/test/ets_SUITE.erl" "$OTP_SRC/lib/stdlib/test/ets_SUITE_data" \
      "$OTP_SRC/erts/emulator/test/erts_test_utils.erl" "$src/"
    from=$OTP_SRC
  else
    tarball=${OTP_TARBALL:-}
    if [ -z "$tarball" ]; then
      for d in "${HEFT_OTP_SRC:-/var/cache/heft-otp/src}/$release" "$work"; do
        tarball=$(ls "$d"/erlang_"$release".*.orig.tar.xz 2>/dev/null | head -1 || true)
        [ -n "$tarball" ] && break
      done
    fi
    if [ -z "$tarball" ]; then
      echo "Fetching Debian's source package of erlang..."
      (cd "$work" && apt-get source --download-only erlang >/dev/null)
      tarball=$(ls "$work"/erlang_*.orig.tar.xz | head -1)
    fi
    case "$(basename "$tarball")" in
      erlang_"$release".*) ;;
      *)
        echo "$tarball is not OTP $release's source (the VM is OTP $version)" >&2
        exit 1
        ;;
    esac
    tar -xJf "$tarball" -C "$src" --strip-components=1 --wildcards \
      '*/lib/stdlib/test/ets_SUITE.erl' '*/lib/stdlib/test/ets_SUITE_data/*' \
      '*/erts/emulator/test/erts_test_utils.erl'
    mv "$src"/lib/stdlib/test/ets_SUITE.erl "$src"/lib/stdlib/test/ets_SUITE_data \
      "$src"/erts/emulator/test/erts_test_utils.erl "$src/"
    rm -rf "$src/lib" "$src/erts"
    from=$(basename "$tarball")
  fi
  # test_server's hook, which reads an OTP test installation, is not
  # wanted: results come from heft_ets_cth. The group of long throughput
  # benchmarks is left out (test_throughput_benchmark, a short run of the
  # same code, stays).
  perl -0pi -e 's/\{ct_hooks,\s*\[ts_install_cth\]\},[ \t]*//; s/\{group, benchmark\},[ \t]*//' \
    "$src/ets_SUITE.erl"
  echo "ets_SUITE from $from, on OTP $version"

  source bin/ensure-deps >/dev/null
  MIX_ENV=test mix compile >/dev/null
fi

# Heft and Elixir as libraries, for the suite's node and the peer nodes
# some cases start.
elixir_lib=$(elixir -e 'IO.write(:code.lib_dir(:elixir))')
export ERL_LIBS="$root/_build/test/lib:$(dirname "$elixir_lib")"

rewrite=$(
  cat <<'PERL'
s/\bets:(?!fun2ms\b)/heft_ets_shim:/g;
s/(?<![\w'"])(?<!out, \{)ets(?=\s*,)/heft_ets_shim/g;
s/'ETS-TRANSFER'/'HEFT-TRANSFER'/g;
s/erts_debug:set_internal_state\((ets_force_split|ets_debug_random_split_join),/heft_ets_shim:ets_debug_state($1,/g;
s/\{Smp, Smp, Smp, \[ordered_set \| Lacc\]\}/{Smp, Smp, false, [ordered_set | Lacc]}/;
PERL
)

# Runs the suite of side $1 (ets: as it is; heft: rewritten to the shim)
# on the cases given, writing tmp/otp_ets/<release>/run-<side>/results.
run_side() {
  local side=$1 dir=$work/run-$1 fresh=true
  shift
  # A run of some cases adds to the results of the last runs (a case's
  # latest outcome counts); a run of the whole suite starts afresh.
  if [ $# -gt 0 ] && [ -f "$dir/results" ]; then
    fresh=false
    mv "$dir/results" "$work/results-$side"
  fi
  rm -rf "$dir"
  mkdir -p "$dir/logs"
  [ "$fresh" = false ] && mv "$work/results-$side" "$dir/results"
  cp -r "$src/ets_SUITE.erl" "$src/ets_SUITE_data" "$src/erts_test_utils.erl" "$dir/"
  if [ "$side" = heft ]; then
    # Every call of ets (but ets:fun2ms/1, a parse transform's) goes to the
    # shim, as does the module `ets` passed to apply/3 and to the suite's
    # helpers; trace patterns on ETS's own functions stay. Heft's transfer
    # message is tagged 'HEFT-TRANSFER'. ETS's debugging knobs for its
    # ordered_set's lock tree (forced splits and joins) do nothing on a
    # Heft table, so the suite's tables of type stim_cat_ord_set are made
    # as its cat_ord_set ones (an ordered_set with write_concurrency).
    perl -pi -e "$rewrite" "$dir/ets_SUITE.erl"
    cp "$here/heft_ets_shim.erl" "$dir/"
  fi
  cp "$here/heft_ets_cth.erl" "$dir/"
  (cd "$dir" && erlc *.erl >erlc.out 2>&1) || {
    cat "$dir/erlc.out" >&2
    exit 1
  }

  local cases
  cases=$(printf "'%s'," "$@")
  cases="[${cases%,}]"
  [ $# -eq 0 ] && cases="[]"
  echo "Running ets_SUITE on $side..."
  (cd "$dir" && erl -sname "heft_otp_ets_${side}_$$" -pa "$dir" -noshell -eval "
    Which = fun(C) -> case lists:keymember(C, 1, ets_SUITE:groups()) of
                        true -> {group, C}; false -> {testcase, C} end end,
    Sel = case $cases of
            [] -> [];
            Cs -> Gs = [G || C <- Cs, {group, G} <- [Which(C)]],
                  Ts = [T || C <- Cs, {testcase, T} <- [Which(C)]],
                  [{group, Gs} || Gs =/= []] ++ [{testcase, Ts} || Ts =/= []]
          end,
    Extra = case os:getenv(\"OTP_ETS_CT_OPTS\") of
              false -> [];
              S -> {ok, Tk, _} = erl_scan:string(S ++ \".\"),
                   {ok, E} = erl_parse:parse_term(Tk), E
            end,
    % The suite checks that ETS's memory is the same after a case as before
    % it: the code server's ETS table grows when a module loads, so every
    % module Heft may need is loaded first, and Heft has made a table.
    [begin _ = application:load(A), {ok, Ms} = application:get_key(A, modules),
           [{module, _} = code:ensure_loaded(M) || M <- Ms] end || A <- [elixir, heft]],
    [heft:delete(heft:new(heft_otp_ets_warm_up, [])) || \"$side\" =:= \"heft\"],
    ct:run_test([{suite, ets_SUITE}, {dir, \"$dir\"}, {logdir, \"$dir/logs\"},
                 {auto_compile, false}, {silent_connections, all},
                 {ct_hooks, [{heft_ets_cth, [{file, \"$dir/results\"}, {fresh, $fresh}]}]}]
                ++ Sel ++ Extra),
    halt()." >"$dir/ct.out" 2>&1) || true
  [ -f "$dir/results" ] || {
    echo "ets_SUITE on $side wrote no results: see $dir/ct.out" >&2
    tail -20 "$dir/ct.out" >&2
    exit 1
  }
}

if [ -z "$report_only" ]; then
  for side in "${sides[@]}"; do run_side "$side" "$@"; done
fi

# The comparison, case by case, in the order of the Heft run.
exec erl -noshell -eval "
  Read = fun(Side) ->
           case file:consult(\"$work/run-\" ++ Side ++ \"/results\") of
             {ok, L} -> L;
             {error, enoent} -> []
           end
         end,
  Ets = maps:from_list([{C, {S, D}} || {C, S, D} <- Read(\"ets\")]),
  % A case's last line is its outcome; cases in the order they ran.
  Last = fun(L) -> M = maps:from_list([{C, {S, D}} || {C, S, D} <- L]),
                   {Cs, _} = lists:foldl(fun({C, _, _}, {Acc, Seen}) ->
                                             case sets:is_element(C, Seen) of
                                               true -> {Acc, Seen};
                                               false -> {[C | Acc], sets:add_element(C, Seen)}
                                             end
                                         end, {[], sets:new()}, L),
                   [{C, element(1, maps:get(C, M)), element(2, maps:get(C, M))}
                    || C <- lists:reverse(Cs)]
         end,
  Heft = Last(Read(\"heft\")),
  Class = fun(C, HS) ->
            case {maps:get(C, Ets, {unknown, \"\"}), HS} of
              {{skipped, _}, _} -> skipped;
              {{passed, _}, passed} -> pass;
              {{passed, _}, _} -> 'HEFT';
              {{failed, _}, passed} -> 'ets-only';
              {{failed, _}, _} -> both;
              {{unknown, _}, _} -> 'no-baseline'
            end
          end,
  Rows = [{C, Class(C, S), S, D} || {C, S, D} <- Heft],
  [io:format(\"~-9s ~p~s~n\", [K, C, case K of
                                     'HEFT' -> \" (\" ++ atom_to_list(S) ++ \"): \" ++ D;
                                     both -> \": \" ++ element(2, maps:get(C, Ets));
                                     skipped -> \": \" ++ element(2, maps:get(C, Ets));
                                     'no-baseline' -> \" (\" ++ atom_to_list(S) ++ \"): \" ++ D;
                                     _ -> \"\"
                                   end])
   || {C, K, S, D} <- Rows],
  N = fun(K) -> length([x || {_, K1, _, _} <- Rows, K1 =:= K]) end,
  PassEts = length([x || {_, {passed, _}} <- maps:to_list(Ets)]),
  io:format(\"~nheft otp_ets OTP $version: ~p cases, ~p pass on ETS, ~p on Heft; \"
            \"~p pass on both, ~p fail only on Heft, ~p fail on both, ~p fail only on ETS, \"
            \"~p skipped~s~n\",
            [length(Rows), PassEts, length([x || {_, _, passed, _} <- Rows]),
             N(pass), N('HEFT'), N(both), N('ets-only'), N(skipped),
             case N('no-baseline') of 0 -> \"\"; NB -> io_lib:format(\", ~p without a baseline\", [NB]) end]),
  halt()."
