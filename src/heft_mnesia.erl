%% @doc Heft as a Mnesia storage backend (OTP 25's `mnesia_backend_type').
%%
%% Two aliases, registered with
%% `mnesia:create_schema(Nodes, [{backend_types, [{heft_copies, heft_mnesia},
%% {heft_ram_copies, heft_mnesia}]}])' or `mnesia:add_backend_type/2':
%%
%% <ul>
%% <li>`heft_copies': disc_only_copies semantics; each table is a persistent
%%   Heft table in `<mnesia dir>/<Tab>.heft/' (durability from Heft's own
%%   log; storage_properties `[{heft, [{sync, none | commit | {interval, Ms}},
%%   {compression, zlib | none}, {compression_level, 0..9},
%%   {dump_log_write_threshold, N}, {dump_log_time_threshold, Ms}]}]').</li>
%% <li>`heft_ram_copies': ram_copies semantics; a Heft table in a memory
%%   arena (`{heft, [{compression, _}, {compression_level, _}]}').</li>
%% </ul>
%%
%% Types set, ordered_set and bag. Secondary indexes (ordered and bag) and
%% checkpoint retainers are Heft tables in memory; indexes are rebuilt by
%% Mnesia whenever a table is loaded (is_index_consistent/2 is always
%% false). Tables are owned by heft_mnesia_admin (under mnesia_ext_sup);
%% data operations read the table's handle from persistent_term and call
%% Heft directly. See docs/mnesia.md.
-module(heft_mnesia).

%% Initialisation and schema
-export([init_backend/0, add_aliases/1, remove_aliases/1,
         check_definition/4, semantics/2]).
%% Tables
-export([create_table/3, load_table/4, delete_table/2, close_table/2,
         sync_close_table/2, real_suffixes/0, tmp_suffixes/0, info/3,
         fixtable/3, validate_key/6, validate_record/6,
         index_is_consistent/3, is_index_consistent/2]).
%% Table transfer (mnesia_loader)
-export([sender_init/4, sender_handle_info/5, receiver_first_message/4,
         receive_data/5, receive_done/4]).
%% Records
-export([insert/3, lookup/3, delete/3, match_delete/3, update_counter/4,
         first/2, last/2, next/3, prev/3, slot/3,
         select/1, select/3, select/4, select_reverse/3, select_reverse/4,
         repair_continuation/2]).

-define(TYPES, [set, ordered_set, bag]).
%% Objects a chunk of a table transfer to another node.
-define(TRANSFER_CHUNK, 256).

%%% Initialisation

%% @doc Starts the table owner (also started lazily by every callback that
%% opens a table: Mnesia may never call this on a node).
init_backend() ->
    heft_mnesia_admin:ensure_started().

add_aliases(_Aliases) -> ok.

remove_aliases(_Aliases) -> ok.

semantics(Alias, storage) ->
    case kind(Alias) of
        heft_copies -> disc_only_copies;
        heft_ram_copies -> ram_copies;
        undefined -> undefined
    end;
semantics(_Alias, types) -> ?TYPES;
semantics(_Alias, index_types) -> [ordered, bag];
semantics(_Alias, _Item) -> undefined.

%% @doc Checks the table's type and its `{heft, Options}' storage property.
check_definition(Alias, Tab, _Nodes, Props) ->
    Type = proplists:get_value(type, Props, set),
    case lists:member(Type, ?TYPES) of
        false -> {error, {unsupported_type, Tab, Type}};
        true -> check_options(kind(Alias), heft_options(Props))
    end.

check_options(Alias, Opts) when is_list(Opts) ->
    case [O || O <- Opts, not valid_option(Alias, O)] of
        [] -> ok;
        Bad -> {error, {invalid_heft_options, Bad}}
    end;
check_options(_Alias, Opts) ->
    {error, {invalid_heft_options, Opts}}.

valid_option(_, {compression, C}) -> C =:= zlib orelse C =:= none;
valid_option(_, {compression_level, L}) -> is_integer(L) andalso L >= 0 andalso L =< 9;
valid_option(heft_copies, {sync, S}) ->
    S =:= none orelse S =:= commit orelse
        (is_tuple(S) andalso tuple_size(S) =:= 2 andalso element(1, S) =:= interval
         andalso is_integer(element(2, S)) andalso element(2, S) >= 1);
valid_option(heft_copies, {K, N}) when K =:= dump_log_write_threshold;
                                       K =:= dump_log_time_threshold ->
    is_integer(N) andalso N >= 1;
valid_option(_, _) -> false.

heft_options(Props) ->
    SP = proplists:get_value(storage_properties, Props, []),
    proplists:get_value(heft, SP, []).

%%% Tables

%% @doc Opens the table, creating it if it does not exist; never truncates.
%% Runs inside mnesia_monitor (and with `[]' as properties from
%% mnesia_dumper), so it only opens.
create_table(Alias, Tab, Props) ->
    _ = open(Alias, Tab, Props),
    ok.

%% @doc Opens the table (load_table(startup) or (restore) may come without
%% create_table/3). A load from another node (`{net_load, Node}') starts
%% from an empty table, so that keys deleted while this node was away do
%% not survive the reload.
load_table(Alias, Tab, {net_load, _Node}, Props) ->
    _ = open(Alias, Tab, Props),
    write(Alias, Tab, fun heft:delete_all_objects/1);
load_table(Alias, Tab, _Reason, Props) ->
    _ = open(Alias, Tab, Props),
    ok.

%% @doc Deletes the table and its files (also when it is not open), and
%% with a table its indexes: Mnesia 4.21 deletes the index tables of an
%% external table only for disc_only_copies semantics, so a
%% heft_ram_copies table's would outlive its del_table_copy.
delete_table(Alias, Tab) ->
    ok = heft_mnesia_admin:close(Alias, Tab, delete),
    case Tab of
        _ when is_atom(Tab) ->
            _ = [ok = heft_mnesia_admin:close(A, Ix, delete)
                 || {A, {T, index, _} = Ix} <- heft_mnesia_admin:tables(),
                    A =:= Alias, T =:= Tab],
            _ = kind(Alias) =:= heft_copies andalso file:del_dir_r(dir(Tab)),
            ok;
        _ ->
            ok
    end.

%% @doc Mnesia closes a table between the log replay of its startup and
%% its load; the table stays open (reopening a big table costs its
%% snapshot load) and its log is synced. It is closed when Mnesia stops.
close_table(Alias, Tab) ->
    sync_close_table(Alias, Tab).

sync_close_table(Alias, Tab) ->
    case {kind(Alias), is_atom(Tab), heft_mnesia_admin:handle(Alias, Tab)} of
        {heft_copies, true, T} when T =/= undefined ->
            try heft:sync(T) of
                _ -> ok
            catch
                %% Gone with an admin killed together with Mnesia.
                error:#{'__struct__' := 'Elixir.ArgumentError'} -> ok
            end;
        %% Not open, or in memory: a heft_ram_copies table, an index, a retainer.
        _ -> ok
    end.

real_suffixes() -> [".heft"].

tmp_suffixes() -> [].

%% @doc `size' is exact; `memory' is in words (Heft counts bytes), as
%% Mnesia prints it; other items are Heft's (undefined if unknown).
info(Alias, Tab, Item) ->
    case heft_mnesia_admin:handle(Alias, Tab) of
        undefined ->
            undefined;
        T ->
            try info_item(T, Item)
            catch error:_ -> undefined
            end
    end.

info_item(T, memory) ->
    case heft:info(T, memory) of
        undefined -> undefined;
        Bytes -> Bytes div erlang:system_info(wordsize)
    end;
info_item(T, Item) ->
    heft:info(T, Item).

%% @doc Fixes or releases the table for the calling process
%% (Heft.safe_fixtable/2): Mnesia fixes a table around its traversals
%% (mnesia_tm on behalf of a transaction, index builds, checkpoints), and
%% a fixed set or bag keeps its slot numbering, so that a slot walk sees
%% every record once. Never raises: mnesia_tm calls this without a catch,
%% and a table deleted meanwhile has nothing left to fix or release.
fixtable(Alias, Tab, Bool) when is_boolean(Bool) ->
    case heft_mnesia_admin:handle(Alias, Tab) of
        undefined -> true;
        T ->
            try heft:safe_fixtable(T, Bool)
            catch error:_ -> true
            end
    end.

validate_key(_Alias, Tab, RecName, Arity, Type, Key) ->
    storable(Tab, Key),
    {RecName, Arity, Type}.

%% @doc Runs where the record is written, in the transaction (or before a
%% dirty write is sent), before Mnesia's point of no return: a record Heft
%% would refuse at commit aborts here with `{bad_type, Tab,
%% {maps_nested_deeper_than, 64}}' instead of making the node leave
%% Mnesia. Heft refuses maps nested more than 64 deep in a key or a bag's
%% object; index tables are bags of `{IxVal, Key}' or ordered_sets keyed
%% `{IxVal, Key}', so an indexed attribute is held to the same limit.
validate_record(_Alias, Tab, RecName, Arity, Type, Obj) ->
    case Type of
        bag -> storable(Tab, Obj);
        _ ->
            storable(Tab, element(2, Obj)),
            lists:foreach(fun(P) -> storable(Tab, index_value(Obj, P)) end,
                          index_positions(Tab))
    end,
    {RecName, Arity, Type}.

%% How deep Heft lets maps nest in a key or a bag's object
%% (native/heft_nif/src/codec.rs, MAX_MAP_DEPTH; lib/heft.ex, "Differences
%% from ETS").
-define(MAX_MAP_DEPTH, 64).

storable(Tab, Term) ->
    case maps_within(Term, ?MAX_MAP_DEPTH) of
        true -> ok;
        false -> mnesia:abort({bad_type, Tab, {maps_nested_deeper_than, ?MAX_MAP_DEPTH}})
    end.

%% Whether maps nest at most Budget deep in Term (lists, tuples and maps
%% walked; other terms hold no maps).
maps_within(Term, Budget) when is_map(Term) ->
    Budget > 0 andalso
        maps:fold(fun(K, V, Ok) ->
                          Ok andalso maps_within(K, Budget - 1) andalso maps_within(V, Budget - 1)
                  end, true, Term);
maps_within(Term, Budget) when is_tuple(Term) ->
    tuple_within(Term, tuple_size(Term), Budget);
maps_within([H | T], Budget) ->
    maps_within(H, Budget) andalso maps_within(T, Budget);
maps_within(_Term, _Budget) ->
    true.

tuple_within(_Tuple, 0, _Budget) -> true;
tuple_within(Tuple, I, Budget) ->
    maps_within(element(I, Tuple), Budget) andalso tuple_within(Tuple, I - 1, Budget).

%% The indexed positions of the table (an index plugin's, not a
%% position, indexes values of its own making: the whole record is held
%% to the limit then).
index_positions(Tab) ->
    try mnesia_lib:val({Tab, index})
    catch _:_ -> []
    end.

index_value(Obj, P) when is_integer(P), P =< tuple_size(Obj) -> element(P, Obj);
index_value(Obj, _P) -> Obj.

%% @doc Indexes are never reported consistent: Mnesia rebuilds them at
%% every load, after a log replay or a reload from a peer.
index_is_consistent(_Alias, _IxTag, _Bool) -> ok.

is_index_consistent(_Alias, _IxTag) -> false.

%%% Table transfer: the sender walks the table with select/4, whose
%%% continuations are plain data.

sender_init(Alias, Tab, _RemoteStorage, _ReceiverPid) ->
    {standard,
     fun() -> select(Alias, Tab, [{'_', [], ['$_']}], ?TRANSFER_CHUNK) end,
     fun(Cont) -> select(Cont) end}.

sender_handle_info(_Msg, _Alias, _Tab, _ReceiverPid, Cont) ->
    {fun(C) -> select(C) end, Cont}.

receiver_first_message(Sender, {first, Size}, Alias, Tab) ->
    {Size, {Alias, Tab, Sender}}.

receive_data(Data, Alias, Tab, _Sender, State) ->
    ok = write(Alias, Tab, fun(T) -> heft:insert(T, Data) end),
    {more, State}.

receive_done(_Alias, _Tab, _Sender, _State) -> ok.

%%% Records

insert(Alias, Tab, Obj) ->
    write(Alias, Tab, fun(T) -> heft:insert(T, Obj) end).

lookup(Alias, Tab, Key) ->
    heft:lookup(h(Alias, Tab), Key).

delete(Alias, Tab, Key) ->
    write(Alias, Tab, fun(T) -> heft:delete(T, Key) end).

%% @doc A pattern with no wildcard nor variable (Mnesia deletes a bag
%% index entry so: `{IxVal, Key}') is one object: Heft's delete_object/2,
%% which goes to its key, instead of a match over the key's objects.
match_delete(Alias, Tab, Pattern) ->
    case ground(Pattern) of
        true -> write(Alias, Tab, fun(T) -> heft:delete_object(T, Pattern) end);
        false -> write(Alias, Tab, fun(T) -> heft:match_delete(T, Pattern) end)
    end.

%% Whether a match pattern holds no '_' and no '$N' variable.
ground(A) when is_atom(A) ->
    case atom_to_list(A) of
        "_" -> false;
        [$$ | Digits] when Digits =/= [] -> not lists:all(fun(C) -> C >= $0 andalso C =< $9 end, Digits);
        _ -> true
    end;
ground(T) when is_tuple(T) -> ground(tuple_to_list(T));
ground([H | T]) -> ground(H) andalso ground(T);
ground(M) when is_map(M) -> ground(maps:to_list(M));
ground(_) -> true.

%% @doc Atomic, also for a missing key and a negative result, as Mnesia's
%% dirty_update_counter wants it (a missing counter starts at 0, a result
%% below 0 is 0): one Heft update_counter/4 with a default and a
%% threshold, instead of Mnesia's read-then-write fallback.
update_counter(Alias, Tab, Key, Incr) when is_integer(Incr) ->
    T = h(Alias, Tab),
    Op = if Incr < 0 -> {3, Incr, 0, 0};
            true -> {3, Incr}
         end,
    case record_name(Tab) of
        undefined -> heft:update_counter(T, Key, Op);
        RecName -> heft:update_counter(T, Key, Op, {RecName, Key, 0})
    end;
update_counter(Alias, Tab, Key, Op) ->
    heft:update_counter(h(Alias, Tab), Key, Op).

first(Alias, Tab) -> heft:first(h(Alias, Tab)).

last(Alias, Tab) -> heft:last(h(Alias, Tab)).

next(Alias, Tab, Key) -> heft:next(h(Alias, Tab), Key).

prev(Alias, Tab, Key) -> heft:prev(h(Alias, Tab), Key).

%% @doc As ets:slot/2, through Heft.slot/2: slots 0, 1, 2... until
%% `'$end_of_table'' hold every record once (a set's or bag's slots are
%% its hash buckets, an ordered_set's slot I its I'th record; a fixed
%% table keeps its slots while others write). A slot beyond the last is
%% badarg, as in ETS.
slot(Alias, Tab, Pos) ->
    T = h(Alias, Tab),
    try heft:slot(T, Pos)
    catch error:#{'__struct__' := 'Elixir.ArgumentError'} -> error(badarg, [Tab, Pos])
    end.

%% @doc Always a list.
select(Alias, Tab, Ms) ->
    heft:select(h(Alias, Tab), Ms).

%% @doc `{Results, Cont}' or `'$end_of_table''; `Cont' is plain data (no
%% table resource, no compiled spec), so it survives term_to_binary and
%% an RPC to another node of the same table.
select(Alias, Tab, Ms, infinity) ->
    at_once(select(Alias, Tab, Ms));
select(Alias, Tab, Ms, Limit) ->
    portable(Alias, Tab, heft:select(h(Alias, Tab), Ms, Limit)).

%% @doc As select/3, in descending key order in an ordered_set (others
%% have no order: the same as select/3). Mnesia asks for it from OTP 29
%% (mnesia:select_reverse/2,4); its continuations go to select/1.
select_reverse(Alias, Tab, Ms) ->
    heft:select_reverse(h(Alias, Tab), Ms).

%% @doc As select/4, in reverse (select_reverse/3).
select_reverse(Alias, Tab, Ms, infinity) ->
    at_once(select_reverse(Alias, Tab, Ms));
select_reverse(Alias, Tab, Ms, Limit) ->
    portable(Alias, Tab, heft:select_reverse(h(Alias, Tab), Ms, Limit)).

select('$end_of_table') ->
    '$end_of_table';
select({heft_mnesia_cont, Alias, Tab, Cont}) ->
    portable(Alias, Tab, 'Elixir.Heft.Select':resume(h(Alias, Tab), Cont)).

%% All results of a select without a limit, as a select with one answers.
at_once([]) -> '$end_of_table';
at_once(Results) -> {Results, '$end_of_table'}.

portable(_Alias, _Tab, '$end_of_table') ->
    '$end_of_table';
portable(_Alias, _Tab, {Results, '$end_of_table'}) ->
    {Results, '$end_of_table'};
portable(Alias, Tab, {Results, Cont}) ->
    {Results, {heft_mnesia_cont, Alias, Tab, 'Elixir.Heft.Select':portable(Cont)}}.

%% @doc Continuations are plain data already.
repair_continuation(Cont, _Ms) -> Cont.

%%% Internals

%% The open table. A callback may come before create_table/3 or
%% load_table/4 on this node: the table is then opened on first use, if
%% Mnesia says this node holds it with this alias. Otherwise (a replica
%% deleted or moved to another storage meanwhile) it raises no_exists,
%% which Mnesia's commit ignores for a replica it no longer has.
h(Alias, Tab) ->
    case handle_or_open(Alias, Tab) of
        missing -> error({no_exists, Tab});
        T -> T
    end.

%% The table's handle, opening it on first use on a node where Mnesia keeps
%% it as `Alias' (init_backend/0 and create_table/3 may never have run here);
%% `missing' where the table is not ours.
handle_or_open(Alias, Tab) ->
    case heft_mnesia_admin:handle(Alias, Tab) of
        undefined ->
            case local_storage(main_tab(Tab)) of
                {ext, Alias, ?MODULE} -> open(Alias, Tab, []);
                _ -> missing
            end;
        T ->
            T
    end.

local_storage(Tab) ->
    try mnesia_lib:val({Tab, storage_type})
    catch _:_ -> unknown
    end.

open(Alias, Tab, Props) ->
    heft_mnesia_admin:open(Alias, Tab, heft_new(Alias, Tab, definition(Tab, Props))).

%% The table's definition: Props, or Mnesia's cstruct when Props is empty
%% (mnesia_dumper creates tables with []). An index or a retainer uses
%% its table's.
definition(Tab, Props) ->
    case lists:keymember(type, 1, Props) of
        true -> Props;
        false ->
            try mnesia_schema:cs2list(mnesia_lib:val({main_tab(Tab), cstruct}))
            catch _:_ -> Props
            end
    end.

main_tab({Tab, index, _}) -> Tab;
main_tab({Tab, retainer, _}) -> Tab;
main_tab(Tab) -> Tab.

%% heft:new/2's name and options for a table, an index or a retainer.
heft_new(_Alias, {Tab, index, {_Pos, IxType}}, _Props) ->
    Type = case IxType of
               ordered -> ordered_set;
               bag -> bag
           end,
    {Tab, [Type, public]};
heft_new(_Alias, {Tab, retainer, _Name}, _Props) ->
    {Tab, [set, public, {keypos, 2}]};
heft_new(Alias, Tab, Props) when is_atom(Tab) ->
    Type = proplists:get_value(type, Props, set),
    Opts = heft_options(Props),
    Common = [Type, public, {keypos, 2}
              | [O || {K, _} = O <- Opts, K =:= compression orelse K =:= compression_level]],
    case kind(Alias) of
        heft_ram_copies ->
            {Tab, Common};
        heft_copies ->
            Persist = [O || {K, _} = O <- Opts,
                            lists:member(K, [sync, dump_log_write_threshold,
                                             dump_log_time_threshold])],
            {Tab, [{persist, unicode:characters_to_binary(dir(Tab))} | Persist] ++ Common}
    end.

%% What an alias stands for: heft_copies or heft_ram_copies, or another
%% name mapped to one of them in the application environment,
%% `{heft, [{mnesia_aliases, [{Alias, heft_copies | heft_ram_copies}]}]}'
%% (test/otp_mnesia runs OTP's Mnesia suite so, with Heft standing in for
%% its test backend's aliases).
kind(heft_copies) -> heft_copies;
kind(heft_ram_copies) -> heft_ram_copies;
kind(Alias) ->
    %% Loaded for its environment (`-heft mnesia_aliases ...' on the
    %% command line, or ERL_AFLAGS, reaches every node started after).
    _ = application:load(heft),
    case application:get_env(heft, mnesia_aliases) of
        {ok, Map} when is_list(Map) ->
            case lists:keyfind(Alias, 1, Map) of
                {_, K} when K =:= heft_copies; K =:= heft_ram_copies -> K;
                _ -> undefined
            end;
        _ ->
            undefined
    end.

dir(Tab) ->
    filename:join(mnesia_lib:dir(), atom_to_list(Tab) ++ ".heft").

record_name(Tab) when is_atom(Tab) ->
    try mnesia_lib:val({Tab, record_name})
    catch _:_ -> undefined
    end;
record_name(_) ->
    undefined.

%% A write comes after Mnesia's point of no return: if Heft refuses it
%% (a full disk, a failed fsync) or raises, this replica would silently
%% differ from the others (Mnesia's commit ignores a failed update), so
%% the node leaves Mnesia instead.
%%
%% A write to an index this node no longer has with this alias does
%% nothing: when a table's copy changes from a Heft alias to another
%% storage, Mnesia 4.21 (mnesia_index:add_index_info/3) keeps the old
%% index entry beside the new one in the table's commit work, and applies
%% every write to both before the record itself; raising there (as h/2
%% does for a table gone) would make Mnesia's commit skip the record.
write(Alias, Tab, Write) ->
    case target(Alias, Tab) of
        stale -> ok;
        T -> write(Alias, Tab, T, Write)
    end.

target(Alias, {_, index, _} = Tab) ->
    case handle_or_open(Alias, Tab) of
        missing -> stale;
        T -> T
    end;
target(Alias, Tab) ->
    h(Alias, Tab).

write(Alias, Tab, T, Write) ->
    try Write(T) of
        Result -> written(Alias, Tab, Result)
    catch
        Class:Reason:Stack -> failed(Alias, Tab, {Class, Reason, Stack})
    end.

written(_Alias, _Tab, true) -> ok;
written(_Alias, _Tab, N) when is_integer(N) -> ok;
written(Alias, Tab, Other) -> failed(Alias, Tab, Other).

%% mnesia_lib:fatal/2 stops Mnesia and exits.
-spec failed(atom(), atom(), term()) -> no_return().
failed(Alias, Tab, Why) ->
    mnesia_lib:fatal("heft_mnesia: a write to ~tp (~p) failed: ~tp; "
                     "this replica can no longer follow the others~n",
                     [Tab, Alias, Why]).
