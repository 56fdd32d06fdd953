%% ETS's API on Heft, for OTP's own ets_SUITE (test/otp_ets/run.sh
%% rewrites the suite's calls of `ets' to this module).
%%
%% Each table call goes to the `heft' function of the same name and arity
%% (src/heft.erl), with only the translation a porting user would write:
%%
%%   - Heft raises `ArgumentError' where ETS raises badarg; here it is
%%     badarg again, so that the suite's `{'EXIT', {badarg, _}}' matches.
%%   - `info/1,2' answer `memory' in words, as ETS does (Heft: bytes).
%%   - `info(T, stats)', ETS's statistics of a hash table's buckets (an
%%     item for OTP's test suites), is computed from Heft's `slot/2': its
%%     slots are the buckets, the objects of a slot the bucket's chain.
%%     Heft keeps no deleted objects, so the count of those is 0; its one
%%     lock counts as one. An ordered_set has none (`false', as a plain
%%     ordered_set of ETS).
%%   - `{write_concurrency, {debug_hash_fixed_number_of_locks, N}}', a
%%     debugging option of ETS's hash tables, is `{write_concurrency, true}'.
%%   - `tab2file/2,3' write ETS's format (`{format, ets}'), which the suite
%%     reads with `disk_log' itself.
%%
%% The match specification functions that touch no table
%% (`match_spec_compile/1', `match_spec_run/2', `is_compiled_ms/1',
%% `test_ms/2') are ETS's own: Heft runs match specifications with them.
%% Anything else ETS exports and Heft lacks is left out on purpose, so
%% that a case using it fails with `undef' and shows up in the report.
-module(heft_ets_shim).

-export([new/2, delete/1, delete/2, delete_all_objects/1, delete_object/2,
         insert/2, insert_new/2, lookup/2, lookup_element/3, lookup_element/4,
         member/2, take/2,
         update_counter/3, update_counter/4, update_element/3, update_element/4,
         first/1, next/2, last/1, prev/2, first_lookup/1, next_lookup/2,
         last_lookup/1, prev_lookup/2, foldl/3, foldr/3, tab2list/1,
         select/1, select/2, select/3, select_reverse/1, select_reverse/2,
         select_reverse/3, select_count/2, select_delete/2, select_replace/2,
         match/1, match/2, match/3, match_object/1, match_object/2,
         match_object/3, match_delete/2,
         tab2file/2, tab2file/3, file2tab/1, file2tab/2, tabfile_info/1,
         info/1, info/2, whereis/1, all/0, give_away/3, rename/2, setopts/2,
         safe_fixtable/2, slot/2, init_table/2, repair_continuation/2,
         to_dets/2, from_dets/2, i/0, i/1,
         match_spec_compile/1, match_spec_run/2, is_compiled_ms/1, test_ms/2,
         ets_debug_state/2]).

%% heft:F(Args...), its ArgumentError raised as ETS's badarg, with the
%% arguments in the stack trace (the suite checks them).
-define(H(F, Args),
        try
            apply(heft, F, Args)
        catch
            error:#{'__struct__' := 'Elixir.ArgumentError'} -> erlang:error(badarg, Args)
        end).

new(Name, Opts) ->
    try
        heft:new(Name, options(Opts))
    catch
        error:#{'__struct__' := 'Elixir.ArgumentError'} -> erlang:error(badarg, [Name, Opts])
    end.

options(Opts) ->
    try [option(O) || O <- Opts] catch error:_ -> Opts end.

option({write_concurrency, {debug_hash_fixed_number_of_locks, _}}) ->
    {write_concurrency, true};
option(O) -> O.

delete(T) -> ?H(delete, [T]).
delete(T, K) -> ?H(delete, [T, K]).
delete_all_objects(T) -> ?H(delete_all_objects, [T]).
delete_object(T, O) -> ?H(delete_object, [T, O]).
insert(T, O) -> ?H(insert, [T, O]).
insert_new(T, O) -> ?H(insert_new, [T, O]).
lookup(T, K) -> ?H(lookup, [T, K]).
lookup_element(T, K, P) -> ?H(lookup_element, [T, K, P]).
member(T, K) -> ?H(member, [T, K]).
take(T, K) -> ?H(take, [T, K]).
update_counter(T, K, Op) -> ?H(update_counter, [T, K, Op]).
update_counter(T, K, Op, D) -> ?H(update_counter, [T, K, Op, D]).
update_element(T, K, E) -> ?H(update_element, [T, K, E]).
update_element(T, K, E, D) -> ?H(update_element, [T, K, E, D]).
lookup_element(T, K, P, D) -> ?H(lookup_element, [T, K, P, D]).
first_lookup(T) -> ?H(first_lookup, [T]).
next_lookup(T, K) -> ?H(next_lookup, [T, K]).
last_lookup(T) -> ?H(last_lookup, [T]).
prev_lookup(T, K) -> ?H(prev_lookup, [T, K]).

first(T) -> ?H(first, [T]).
next(T, K) -> ?H(next, [T, K]).
last(T) -> ?H(last, [T]).
prev(T, K) -> ?H(prev, [T, K]).
foldl(F, A, T) -> ?H(foldl, [F, A, T]).
foldr(F, A, T) -> ?H(foldr, [F, A, T]).
tab2list(T) -> ?H(tab2list, [T]).

select(C) -> ?H(select, [C]).
select(T, MS) -> ?H(select, [T, MS]).
select(T, MS, N) -> ?H(select, [T, MS, N]).
select_reverse(C) -> ?H(select_reverse, [C]).
select_reverse(T, MS) -> ?H(select_reverse, [T, MS]).
select_reverse(T, MS, N) -> ?H(select_reverse, [T, MS, N]).
select_count(T, MS) -> ?H(select_count, [T, MS]).
select_delete(T, MS) -> ?H(select_delete, [T, MS]).
select_replace(T, MS) -> ?H(select_replace, [T, MS]).
match(C) -> ?H(match, [C]).
match(T, P) -> ?H(match, [T, P]).
match(T, P, N) -> ?H(match, [T, P, N]).
match_object(C) -> ?H(match_object, [C]).
match_object(T, P) -> ?H(match_object, [T, P]).
match_object(T, P, N) -> ?H(match_object, [T, P, N]).
match_delete(T, P) -> ?H(match_delete, [T, P]).

tab2file(T, F) -> ?H(tab2file, [T, F, [{format, ets}]]).
tab2file(T, F, O) when is_list(O) -> ?H(tab2file, [T, F, [{format, ets} | O]]);
tab2file(T, F, O) -> ?H(tab2file, [T, F, O]).
file2tab(F) -> ?H(file2tab, [F]).
file2tab(F, O) -> ?H(file2tab, [F, O]).
tabfile_info(F) -> ?H(tabfile_info, [F]).

info(T) ->
    case ?H(info, [T]) of
        L when is_list(L) -> [words(I) || I <- L];
        Other -> Other
    end.

info(T, stats) ->
    case ?H(info, [T, type]) of
        undefined -> undefined;
        ordered_set -> false;
        _ -> hash_stats(T)
    end;
info(T, I) ->
    case ?H(info, [T, I]) of
        M when I =:= memory, is_integer(M) -> element(2, words({memory, M}));
        Other -> Other
    end.

%% {Buckets, AvgChain, StdDev, ExpectedStdDev, MinChain, MaxChain,
%%  KeptDeleted, Locks}, as erl_db_hash.c's db_calc_stats_hash.
hash_stats(T) ->
    N = slots(T),
    Lens = [length(heft:slot(T, I)) || I <- lists:seq(0, N - 1)],
    Sum = lists:sum(Lens),
    SqSum = lists:sum([L * L || L <- Lens]),
    Avg = Sum / N,
    {N, Avg, math:sqrt(max(0.0, (SqSum - Avg * Sum) / N)), math:sqrt(Avg * (1 - 1 / N)),
     lists:min(Lens), lists:max(Lens), 0, 1}.

%% The number of slots N: slot(T, I) is a list below N, '$end_of_table'
%% at N, and raises above.
slots(T) -> slots(T, 0, none).

%% Doubling until past the end, then halving: Lo < N < Hi (none: unknown).
slots(T, Lo, Hi) ->
    I = case Hi of
            none -> max(1, 2 * Lo);
            _ -> (Lo + Hi) div 2
        end,
    case slot_at(T, I) of
        'end' -> I;
        below -> slots(T, I, Hi);
        above -> slots(T, Lo, I)
    end.

slot_at(T, I) ->
    try heft:slot(T, I) of
        '$end_of_table' -> 'end';
        _ -> below
    catch
        error:#{'__struct__' := 'Elixir.ArgumentError'} -> above
    end.

words({memory, Bytes}) ->
    W = erlang:system_info(wordsize),
    {memory, (Bytes + W - 1) div W};
words(Item) -> Item.

whereis(N) -> ?H(whereis, [N]).
all() -> ?H(all, []).
give_away(T, P, D) -> ?H(give_away, [T, P, D]).
rename(T, N) -> ?H(rename, [T, N]).
setopts(T, O) -> ?H(setopts, [T, O]).
safe_fixtable(T, F) -> ?H(safe_fixtable, [T, F]).
slot(T, I) -> ?H(slot, [T, I]).
init_table(T, F) -> ?H(init_table, [T, F]).
repair_continuation(C, MS) -> ?H(repair_continuation, [C, MS]).
to_dets(T, D) -> ?H(to_dets, [T, D]).
from_dets(T, D) -> ?H(from_dets, [T, D]).
i() -> ?H(i, []).
i(T) -> ?H(i, [T]).

match_spec_compile(MS) -> ets:match_spec_compile(MS).
match_spec_run(L, C) -> ets:match_spec_run(L, C).
is_compiled_ms(C) -> ets:is_compiled_ms(C).
test_ms(T, MS) -> ets:test_ms(T, MS).

%% `erts_debug:set_internal_state/2' for ETS's debugging knobs of a table
%% (ets_force_split, ets_debug_random_split_join: the lock tree of an
%% ordered_set with write_concurrency), which Heft tables do not have.
ets_debug_state(_Item, {_Tab, _On}) -> true.
