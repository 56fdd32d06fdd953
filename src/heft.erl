%% @doc Heft for Erlang: the public API of the Elixir module `Heft'
%% (lib/heft.ex, where every function is documented) under Erlang names,
%% so that Erlang code writes `heft:new(users, [set])' instead of
%% `'Elixir.Heft':new(users, [set])'.
%%
%% Every function delegates to the `Heft' function of the same name and
%% arity and returns what it returns; errors are Elixir exceptions
%% (`ArgumentError' where ETS raises badarg: catch them with
%% `error:#{'__struct__' := 'Elixir.ArgumentError'}'). Options are ETS's
%% plus Heft's own, as proplists: `heft:new(t, [ordered_set, {persist,
%% "/var/lib/t"}, {sync, commit}])'.
%%
%% test/erlang/heft_erl_test.exs checks that every public function of `Heft'
%% has its twin here, so the two cannot drift apart.
-module(heft).

-export([new/1, new/2,
         insert/2, insert/3, insert_new/2, insert_new/3,
         lookup/2, lookup_element/3, lookup_element/4, member/2, take/2,
         delete/1, delete/2, delete_object/2, delete_all_objects/1,
         update_counter/3, update_counter/4, update_element/3, update_element/4,
         first/1, next/2, last/1, prev/2,
         first_lookup/1, next_lookup/2, last_lookup/1, prev_lookup/2,
         foldl/3, foldr/3, tab2list/1, stream/1,
         select/1, select/2, select/3,
         select_reverse/1, select_reverse/2, select_reverse/3,
         select_count/2, select_delete/2, select_replace/2,
         match/1, match/2, match/3,
         match_object/1, match_object/2, match_object/3, match_delete/2,
         tab2file/2, tab2file/3, file2tab/1, file2tab/2,
         info/1, info/2, whereis/1, all/0,
         give_away/3, rename/2, setopts/2,
         open/1, open/2, close/1, dump/1, sync/1,
         subscribe/1, subscribe/2, unsubscribe/1, unsubscribe/2,
         safe_fixtable/2, slot/2, init_table/2, repair_continuation/2,
         to_dets/2, from_dets/2, tabfile_info/1, i/0, i/1,
         train_dictionary/1, train_dictionary/2, compact/1]).

-export_type([tab/0, object/0, match_spec/0, continuation/0]).

-define(H, 'Elixir.Heft').

-type tab() :: 'Elixir.Heft.Table':t() | atom().
%% A table: the identifier `new/2' returns, or the name of a named table.
-type object() :: tuple().
-type match_spec() :: [{term(), [term()], [term()]}].
-type continuation() :: term().
-type select_result(R) :: {[R], continuation()} | '$end_of_table'.

%%% Tables

%% @doc Creates a table with the default options (a protected set).
-spec new(atom()) -> tab().
new(Name) -> ?H:new(Name).

%% @doc Creates a table; options as for `ets:new/2' plus Heft's own
%% (`{compression, zlib | none}',
%% `{arena, memory | {file, Dir} | {file, Dir, [{memory, Bytes}]}}',
%% `{persist, Dir}', `{sync, none | {interval, Ms} | commit}', ...).
-spec new(atom(), list()) -> tab().
new(Name, Opts) -> ?H:new(Name, Opts).

%% @doc Deletes the table (a persistent table's files too).
-spec delete(tab()) -> true | {error, atom()}.
delete(Tab) -> ?H:delete(Tab).

%% @doc Every table of this node, as `ets:all/0'.
-spec all() -> [tab()].
all() -> ?H:all().

%% @doc The identifier of the named table, or `undefined'.
-spec whereis(atom()) -> tab() | undefined.
whereis(Name) -> ?H:whereis(Name).

%% @doc Facts and figures about the table; sizes in bytes (ETS: words).
-spec info(tab()) -> [{atom(), term()}] | undefined.
info(Tab) -> ?H:info(Tab).

%% @doc One item of `info/1'.
-spec info(tab(), atom()) -> term() | undefined.
info(Tab, Item) -> ?H:info(Tab, Item).

%% @doc Makes `Pid' the owner and sends it
%% `{'HEFT-TRANSFER', Tab, self(), Data}'.
-spec give_away(tab(), pid(), term()) -> true.
give_away(Tab, Pid, Data) -> ?H:give_away(Tab, Pid, Data).

%% @doc Renames the table.
-spec rename(tab(), atom()) -> tab().
rename(Tab, Name) -> ?H:rename(Tab, Name).

%% @doc Sets the heir (`{heir, Pid, Data}' or `{heir, none}') and the
%% protection (`{protection, P}'), one option or a list.
-spec setopts(tab(), tuple() | [tuple()]) -> true.
setopts(Tab, Opts) -> ?H:setopts(Tab, Opts).

%%% Writes

%% @doc Inserts an object or a list of objects (atomically).
-spec insert(tab(), object() | [object()]) -> true | {error, atom()}.
insert(Tab, Objects) -> ?H:insert(Tab, Objects).

%% @doc `insert/2' with per-call options: `[{sync, commit}]' to wait for
%% stable storage, `[{ttl, Ms | infinity}]' for the keys' time to live.
-spec insert(tab(), object() | [object()], list()) -> true | {error, atom()}.
insert(Tab, Objects, Opts) -> ?H:insert(Tab, Objects, Opts).

%% @doc Inserts unless a key is already there.
-spec insert_new(tab(), object() | [object()]) -> boolean() | {error, atom()}.
insert_new(Tab, Objects) -> ?H:insert_new(Tab, Objects).

%% @doc `insert_new/2' with per-call options, as `insert/3'.
-spec insert_new(tab(), object() | [object()], list()) -> boolean() | {error, atom()}.
insert_new(Tab, Objects, Opts) -> ?H:insert_new(Tab, Objects, Opts).

%% @doc Deletes the objects with the key.
-spec delete(tab(), term()) -> true | {error, atom()}.
delete(Tab, Key) -> ?H:delete(Tab, Key).

%% @doc Deletes exactly this object.
-spec delete_object(tab(), object()) -> true | {error, atom()}.
delete_object(Tab, Object) -> ?H:delete_object(Tab, Object).

%% @doc Deletes every object; the table stays.
-spec delete_all_objects(tab()) -> true | {error, atom()}.
delete_all_objects(Tab) -> ?H:delete_all_objects(Tab).

%% @doc As `ets:update_counter/3'.
-spec update_counter(tab(), term(), integer() | tuple() | [tuple()]) ->
          integer() | [integer()] | {error, atom()}.
update_counter(Tab, Key, Op) -> ?H:update_counter(Tab, Key, Op).

%% @doc As `ets:update_counter/4'.
-spec update_counter(tab(), term(), integer() | tuple() | [tuple()], tuple()) ->
          integer() | [integer()] | {error, atom()}.
update_counter(Tab, Key, Op, Default) -> ?H:update_counter(Tab, Key, Op, Default).

%% @doc As `ets:update_element/3'.
-spec update_element(tab(), term(), {pos_integer(), term()} | [{pos_integer(), term()}]) ->
          boolean() | {error, atom()}.
update_element(Tab, Key, ElementSpec) -> ?H:update_element(Tab, Key, ElementSpec).

%% @doc `update_element/3', inserting `Default' (with the key) updated if
%% the key is missing, as `ets:update_element/4'.
-spec update_element(tab(), term(), {pos_integer(), term()} | [{pos_integer(), term()}],
                     tuple()) -> true.
update_element(Tab, Key, ElementSpec, Default) ->
    ?H:update_element(Tab, Key, ElementSpec, Default).

%%% Reads

%% @doc The objects with the key.
-spec lookup(tab(), term()) -> [object()].
lookup(Tab, Key) -> ?H:lookup(Tab, Key).

%% @doc Element `Pos' of the key's object (a list of them in a bag).
-spec lookup_element(tab(), term(), pos_integer()) -> term().
lookup_element(Tab, Key, Pos) -> ?H:lookup_element(Tab, Key, Pos).

%% @doc `lookup_element/3', or `Default' if there is no such key, as
%% `ets:lookup_element/4'.
-spec lookup_element(tab(), term(), pos_integer(), term()) -> term().
lookup_element(Tab, Key, Pos, Default) -> ?H:lookup_element(Tab, Key, Pos, Default).

%% @doc True if the key is in the table.
-spec member(tab(), term()) -> boolean().
member(Tab, Key) -> ?H:member(Tab, Key).

%% @doc Removes the key's objects and returns them.
-spec take(tab(), term()) -> [object()] | {error, atom()}.
take(Tab, Key) -> ?H:take(Tab, Key).

%%% Walks

%% @doc The first key, or `'$end_of_table''.
-spec first(tab()) -> term().
first(Tab) -> ?H:first(Tab).

%% @doc The key after `Key' (which may have been deleted meanwhile).
-spec next(tab(), term()) -> term().
next(Tab, Key) -> ?H:next(Tab, Key).

%% @doc The last key of an ordered_set (`first/1' elsewhere).
-spec last(tab()) -> term().
last(Tab) -> ?H:last(Tab).

%% @doc The key before `Key' in an ordered_set (`next/2' elsewhere).
-spec prev(tab(), term()) -> term().
prev(Tab, Key) -> ?H:prev(Tab, Key).

%% @doc `{Key, Objects}' of the first key, or `'$end_of_table'', as
%% `ets:first_lookup/1'.
-spec first_lookup(tab()) -> {term(), [object()]} | '$end_of_table'.
first_lookup(Tab) -> ?H:first_lookup(Tab).

%% @doc `{Key, Objects}' of the key after `Key', as `ets:next_lookup/2'.
-spec next_lookup(tab(), term()) -> {term(), [object()]} | '$end_of_table'.
next_lookup(Tab, Key) -> ?H:next_lookup(Tab, Key).

%% @doc `{Key, Objects}' of the last key, as `ets:last_lookup/1'.
-spec last_lookup(tab()) -> {term(), [object()]} | '$end_of_table'.
last_lookup(Tab) -> ?H:last_lookup(Tab).

%% @doc `{Key, Objects}' of the key before `Key', as `ets:prev_lookup/2'.
-spec prev_lookup(tab(), term()) -> {term(), [object()]} | '$end_of_table'.
prev_lookup(Tab, Key) -> ?H:prev_lookup(Tab, Key).

%% @doc Folds `Fun(Object, Acc)' over every object.
-spec foldl(fun((object(), Acc) -> Acc), Acc, tab()) -> Acc.
foldl(Fun, Acc, Tab) -> ?H:foldl(Fun, Acc, Tab).

%% @doc Folds from the last object.
-spec foldr(fun((object(), Acc) -> Acc), Acc, tab()) -> Acc.
foldr(Fun, Acc, Tab) -> ?H:foldr(Fun, Acc, Tab).

%% @doc Every object, as a list.
-spec tab2list(tab()) -> [object()].
tab2list(Tab) -> ?H:tab2list(Tab).

%% @doc A lazy Elixir stream of every object (use it with `'Elixir.Enum'').
-spec stream(tab()) -> term().
stream(Tab) -> ?H:stream(Tab).

%%% Match specifications

%% @doc As `ets:select/2'.
-spec select(tab(), match_spec()) -> [term()].
select(Tab, Spec) -> ?H:select(Tab, Spec).

%% @doc As `ets:select/3'.
-spec select(tab(), match_spec(), pos_integer()) -> select_result(term()).
select(Tab, Spec, Limit) -> ?H:select(Tab, Spec, Limit).

%% @doc Continues `select/3', `match/3', `match_object/3' or `select_reverse/3'.
-spec select(continuation()) -> select_result(term()).
select(Cont) -> ?H:select(Cont).

%% @doc As `ets:select_reverse/2'.
-spec select_reverse(tab(), match_spec()) -> [term()].
select_reverse(Tab, Spec) -> ?H:select_reverse(Tab, Spec).

%% @doc As `ets:select_reverse/3'.
-spec select_reverse(tab(), match_spec(), pos_integer()) -> select_result(term()).
select_reverse(Tab, Spec, Limit) -> ?H:select_reverse(Tab, Spec, Limit).

%% @doc Continues `select_reverse/3'.
-spec select_reverse(continuation()) -> select_result(term()).
select_reverse(Cont) -> ?H:select_reverse(Cont).

%% @doc As `ets:select_count/2'.
-spec select_count(tab(), match_spec()) -> non_neg_integer().
select_count(Tab, Spec) -> ?H:select_count(Tab, Spec).

%% @doc As `ets:select_delete/2'.
-spec select_delete(tab(), match_spec()) -> non_neg_integer() | {error, atom()}.
select_delete(Tab, Spec) -> ?H:select_delete(Tab, Spec).

%% @doc As `ets:select_replace/2'.
-spec select_replace(tab(), match_spec()) -> non_neg_integer() | {error, atom()}.
select_replace(Tab, Spec) -> ?H:select_replace(Tab, Spec).

%% @doc As `ets:match/2'.
-spec match(tab(), term()) -> [[term()]].
match(Tab, Pattern) -> ?H:match(Tab, Pattern).

%% @doc As `ets:match/3'.
-spec match(tab(), term(), pos_integer()) -> select_result([term()]).
match(Tab, Pattern, Limit) -> ?H:match(Tab, Pattern, Limit).

%% @doc Continues `match/3'.
-spec match(continuation()) -> select_result([term()]).
match(Cont) -> ?H:match(Cont).

%% @doc As `ets:match_object/2'.
-spec match_object(tab(), term()) -> [object()].
match_object(Tab, Pattern) -> ?H:match_object(Tab, Pattern).

%% @doc As `ets:match_object/3'.
-spec match_object(tab(), term(), pos_integer()) -> select_result(object()).
match_object(Tab, Pattern, Limit) -> ?H:match_object(Tab, Pattern, Limit).

%% @doc Continues `match_object/3'.
-spec match_object(continuation()) -> select_result(object()).
match_object(Cont) -> ?H:match_object(Cont).

%% @doc As `ets:match_delete/2'.
-spec match_delete(tab(), term()) -> true | {error, atom()}.
match_delete(Tab, Pattern) -> ?H:match_delete(Tab, Pattern).

%%% Table files (docs/tab-file.md)

%% @doc Writes the table to a file.
-spec tab2file(tab(), file:name_all()) -> ok | {error, atom()}.
tab2file(Tab, Filename) -> ?H:tab2file(Tab, Filename).

%% @doc Writes the table to a file; `[{sync, true}]' fsyncs it.
-spec tab2file(tab(), file:name_all(), list()) -> ok | {error, atom()}.
tab2file(Tab, Filename, Opts) -> ?H:tab2file(Tab, Filename, Opts).

%% @doc Reads a table written by `tab2file/2,3', or by `ets:tab2file/2,3'.
-spec file2tab(file:name_all()) -> {ok, tab()} | {error, term()}.
file2tab(Filename) -> ?H:file2tab(Filename).

%% @doc Reads a table written by `tab2file/2,3' or `ets:tab2file/2,3', with
%% options.
-spec file2tab(file:name_all(), list()) -> {ok, tab()} | {error, term()}.
file2tab(Filename, Opts) -> ?H:file2tab(Filename, Opts).

%% @doc What a file written by `tab2file/2,3' (or `ets:tab2file/2,3')
%% holds, without loading it, as `ets:tabfile_info/1'.
-spec tabfile_info(file:name_all()) -> {ok, [{atom(), term()}]} | {error, term()}.
tabfile_info(Filename) -> ?H:tabfile_info(Filename).

%% @doc Trains a zstd dictionary on the table's records and puts it in
%% use; older records are re-compressed in the background (see
%% `Heft.train_dictionary/2').
-spec train_dictionary(tab()) -> {ok, pos_integer() | none} | {error, atom()}.
train_dictionary(Tab) -> ?H:train_dictionary(Tab).

-spec train_dictionary(tab(), list()) -> {ok, pos_integer() | none} | {error, atom()}.
train_dictionary(Tab, Opts) -> ?H:train_dictionary(Tab, Opts).

%% @doc Compacts the table's arena now and says what it moved and gave
%% back (see `Heft.compact/1'); tables also compact on their own.
-spec compact(tab()) ->
          {ok, #{moved_records := non_neg_integer(), moved_bytes := non_neg_integer(),
                 returned_bytes := non_neg_integer(),
                 longest_lock_hold_us := non_neg_integer()}}
        | {error, deleted | compaction_failed}.
compact(Tab) -> ?H:compact(Tab).

%%% ETS's remaining calls: fixation, slots, bulk loading, dets, i/0

%% @doc Fixes (`true') or releases (`false') the table for the caller, as
%% `ets:safe_fixtable/2'; a fixed set or bag keeps its `slot/2' numbering.
-spec safe_fixtable(tab(), boolean()) -> true.
safe_fixtable(Tab, Fix) -> ?H:safe_fixtable(Tab, Fix).

%% @doc The objects in slot `I', or `'$end_of_table'' when `I' is the
%% number of slots, as `ets:slot/2'.
-spec slot(tab(), non_neg_integer()) -> [object()] | '$end_of_table'.
slot(Tab, I) -> ?H:slot(Tab, I).

%% @doc Replaces the table's objects with those `InitFun' supplies, as
%% `ets:init_table/2'.
-spec init_table(tab(), fun((read | close) -> term())) -> true | {error, atom()}.
init_table(Tab, InitFun) -> ?H:init_table(Tab, InitFun).

%% @doc Recompiles the match specification of a continuation that went
%% through the external term format, as `ets:repair_continuation/2'.
-spec repair_continuation(continuation() | '$end_of_table', match_spec()) ->
          continuation() | '$end_of_table'.
repair_continuation(Cont, MatchSpec) -> ?H:repair_continuation(Cont, MatchSpec).

%% @doc Empties the open dets table and fills it with the table's objects,
%% as `ets:to_dets/2'; returns `DetsTab'.
-spec to_dets(tab(), dets:tab_name()) -> dets:tab_name().
to_dets(Tab, DetsTab) -> ?H:to_dets(Tab, DetsTab).

%% @doc Inserts the objects of the open dets table, as `ets:from_dets/2'.
-spec from_dets(tab(), dets:tab_name()) -> true | {error, atom()}.
from_dets(Tab, DetsTab) -> ?H:from_dets(Tab, DetsTab).

%% @doc Prints one line about every Heft table of the node, as `ets:i/0'
%% (memory in bytes).
-spec i() -> ok.
i() -> ?H:i().

%% @doc Browses the table's objects on standard input and output, as
%% `ets:i/1'.
-spec i(tab()) -> ok.
i(Tab) -> ?H:i(Tab).

%%% Persistence (see "Persistence" in Heft's documentation)

%% @doc Reopens the persistent table stored in `Dir'.
-spec open(file:name_all()) -> {ok, tab()} | {error, term()}.
open(Dir) -> ?H:open(Dir).

%% @doc Reopens the persistent table stored in `Dir', with options.
-spec open(file:name_all(), list()) -> {ok, tab()} | {error, term()}.
open(Dir, Opts) -> ?H:open(Dir, Opts).

%% @doc Closes a persistent table, keeping its files.
-spec close(tab()) -> ok | {error, atom()}.
close(Tab) -> ?H:close(Tab).

%% @doc Folds the log into a new snapshot now.
-spec dump(tab()) -> ok | {error, atom()}.
dump(Tab) -> ?H:dump(Tab).

%% @doc Waits until every change so far is on stable storage.
-spec sync(tab()) -> ok | {error, atom()}.
sync(Tab) -> ?H:sync(Tab).

%% @doc Subscribes the caller to the table's news.
-spec subscribe(tab()) -> ok.
subscribe(Tab) -> ?H:subscribe(Tab).

%% @doc Subscribes `Pid' to the table's news.
-spec subscribe(tab(), pid()) -> ok.
subscribe(Tab, Pid) -> ?H:subscribe(Tab, Pid).

%% @doc Stops the caller's subscription.
-spec unsubscribe(tab()) -> ok.
unsubscribe(Tab) -> ?H:unsubscribe(Tab).

%% @doc Stops `Pid''s subscription.
-spec unsubscribe(tab(), pid()) -> ok.
unsubscribe(Tab, Pid) -> ?H:unsubscribe(Tab, Pid).
