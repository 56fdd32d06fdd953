%% @doc The owner of heft_mnesia's tables: a small gen_server started
%% under Mnesia's `mnesia_ext_sup', so that the tables live as long as
%% Mnesia does (a Heft table dies, or a persistent one is closed, when its
%% owner exits).
%%
%% It only opens, closes and deletes tables. Each open table's handle is
%% published in persistent_term under `{heft_mnesia, Alias, Tab}' (with
%% the mnesia_ext_sup it was opened under), where heft_mnesia's data
%% operations read it without a message to this process. persistent_term is written only when a table is opened or
%% closed (a global GC each time, as for any persistent_term update).
%%
%% When Mnesia stops, mnesia_ext_sup stops this process: it closes every
%% persistent table (its log synced, its files kept) and deletes the
%% memory ones, as Mnesia drops its ram_copies. When Mnesia is killed
%% (mnesia:lkill/0, as OTP's own suite does), this process gets its
%% supervisor's exit only as a message and may still be closing its tables
%% while a new Mnesia starts: handles published under the old
%% mnesia_ext_sup are then not used, and the new Mnesia's first open waits
%% for this process to end before it starts the next admin.
%%
%% A watcher process monitors it: if it dies while Mnesia runs, in any
%% way (a crash, or `exit(Pid, kill)', which skips terminate/2), its
%% tables are closed under Mnesia, which would run on and find out at the
%% first write, after its point of no return. The watcher makes the node
%% leave Mnesia at once (mnesia_lib:fatal/2), then, once Mnesia is down,
%% forgets the dead tables' handles so that a later mnesia:start() opens
%% them afresh. It forgets them as well when the admin was killed together
%% with Mnesia.
-module(heft_mnesia_admin).
-behaviour(gen_server).

-export([ensure_started/0, start_link/0, open/3, close/3, handle/2, tables/0]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-define(KEY(Alias, Tab), {heft_mnesia, Alias, Tab}).

%% @doc Starts the admin process under mnesia_ext_sup unless it runs.
%% Mnesia may never call init_backend/0 on a node, so every callback that
%% opens a table calls this first.
-spec ensure_started() -> ok.
ensure_started() ->
    case whereis(?MODULE) of
        undefined ->
            start();
        Pid ->
            case ours(Pid) of
                true ->
                    ok;
                false ->
                    %% An admin of a Mnesia that was killed still closes
                    %% its tables (its supervisor died under it) and holds
                    %% the name: wait for it, then start ours.
                    Ref = erlang:monitor(process, Pid),
                    receive {'DOWN', Ref, process, Pid, _} -> ok end,
                    start()
            end
    end.

start() ->
    case mnesia_ext_sup:start_proc(?MODULE, ?MODULE, start_link, []) of
        {ok, _} -> ok;
        {ok, _, _} -> ok;
        {error, {already_started, _}} -> ok;
        {error, Reason} -> error({heft_mnesia_admin_not_started, Reason})
    end.

%% Whether `Pid' is the admin of the running Mnesia (a child of its
%% mnesia_ext_sup); true as well when no Mnesia runs (nothing to wait for).
ours(Pid) ->
    try supervisor:which_children(mnesia_ext_sup) of
        Children -> lists:keyfind(?MODULE, 1, Children) =:= {?MODULE, Pid, worker, [?MODULE]}
    catch
        exit:_ -> true
    end.

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc The handle of an open table, or `undefined'.
-spec handle(atom(), term()) -> heft:tab() | undefined.
handle(Alias, Tab) ->
    case persistent_term:get(?KEY(Alias, Tab), undefined) of
        {T, Sup} when is_pid(Sup) ->
            %% A handle published under a Mnesia that was killed is not
            %% used: its admin may be closing the table right now. That
            %% Mnesia's mnesia_ext_sup is dead then (a new Mnesia has a new
            %% one, registered only once the old one is gone), so its being
            %% alive says what whereis(mnesia_ext_sup) =:= Sup would, at a
            %% fifth of the cost (whereis/1 takes the name registry's
            %% lock): this runs on every data operation.
            case erlang:is_process_alive(Sup) of
                true -> T;
                false -> undefined
            end;
        {T, undefined} ->
            %% Opened with no mnesia_ext_sup running.
            case whereis(mnesia_ext_sup) of
                undefined -> T;
                _ -> undefined
            end;
        undefined ->
            undefined
    end.

%% The handle published for the table, whichever Mnesia it was opened
%% under.
published(Alias, Tab) ->
    case persistent_term:get(?KEY(Alias, Tab), undefined) of
        {T, _Sup} -> T;
        undefined -> undefined
    end.

%% @doc Opens the table (creating it if needed: `heft:new/2' with
%% `Opts') unless it is open; never truncates. Returns its handle.
-spec open(atom(), term(), {atom(), list()}) -> heft:tab().
open(Alias, Tab, {Name, Opts}) ->
    case handle(Alias, Tab) of
        undefined ->
            ensure_started(),
            case gen_server:call(?MODULE, {open, Alias, Tab, Name, Opts}, infinity) of
                {ok, T} -> T;
                {error, Reason} -> error({heft_mnesia_open_failed, Tab, Reason})
            end;
        T ->
            T
    end.

%% @doc Closes (`close': files kept) or deletes (`delete': files removed)
%% an open table; `ok' if it is not open.
-spec close(atom(), term(), close | delete) -> ok.
close(Alias, Tab, How) ->
    case whereis(?MODULE) of
        undefined -> ok;
        _ -> gen_server:call(?MODULE, {close, Alias, Tab, How}, infinity)
    end.

%% @doc Every open table, as `{Alias, Tab}'.
-spec tables() -> [{atom(), term()}].
tables() ->
    [{A, T} || {?KEY(A, T), _} <- persistent_term:get()].

%%% gen_server

init([]) ->
    process_flag(trap_exit, true),
    %% Handles left by an admin that died without terminate/2 (its
    %% watcher forgets them too, unless it was killed with it).
    forget_all(),
    Admin = self(),
    Sup = whereis(mnesia_ext_sup),
    _ = spawn(fun() -> watch(Admin, Sup) end),
    {ok, #{sup => Sup}}.

%% The watcher: waits for the admin's end. A normal stop (Mnesia stops,
%% terminate/2 closed the tables), or Mnesia itself gone (killed: its
%% supervisor is dead), needs nothing more; otherwise Mnesia is running
%% with closed tables: the node leaves it.
watch(Admin, Sup) ->
    Ref = erlang:monitor(process, Admin),
    receive
        {'DOWN', Ref, process, Admin, Reason} ->
            case stopped(Reason) orelse not (is_pid(Sup) andalso is_process_alive(Sup)) of
                true ->
                    %% Killed with Mnesia: its tables went with it. Mnesia
                    %% may restart from a fallback before any admin runs
                    %% (mnesia_bup closes every table first).
                    forget_dead();
                false ->
                    SupRef = erlang:monitor(process, Sup),
                    Fatal = spawn(mnesia_lib, fatal,
                                  ["heft_mnesia_admin, the owner of heft_mnesia's "
                                   "tables, died: ~tp; its tables are closed~n", [Reason]]),
                    receive {'DOWN', SupRef, process, Sup, _} -> ok end,
                    _ = Fatal,
                    forget_dead()
            end
    end.

stopped(normal) -> true;
stopped(shutdown) -> true;
stopped({shutdown, _}) -> true;
stopped(_) -> false.

forget_all() ->
    _ = [persistent_term:erase(K) || {?KEY(_, _) = K, _} <- persistent_term:get()],
    ok.

%% Forgets the handles of tables that no longer exist, and only those: a
%% new admin may already have opened tables of its own.
forget_dead() ->
    _ = [persistent_term:erase(K)
         || {?KEY(_, _) = K, {T, _}} <- persistent_term:get(), heft:info(T, name) =:= undefined],
    ok.

handle_call({open, Alias, Tab, Name, Opts}, _From, S) ->
    case handle(Alias, Tab) of
        undefined ->
            try heft:new(Name, Opts) of
                T ->
                    persistent_term:put(?KEY(Alias, Tab), {T, maps:get(sup, S)}),
                    {reply, {ok, T}, S}
            catch
                error:E -> {reply, {error, reason(E)}, S}
            end;
        T ->
            {reply, {ok, T}, S}
    end;
handle_call({close, Alias, Tab, How}, _From, S) ->
    {reply, do_close(Alias, Tab, How), S}.

handle_cast(_Msg, S) ->
    {noreply, S}.

handle_info(_Msg, S) ->
    {noreply, S}.

%% Stopped by mnesia_ext_sup (Mnesia stops or is killed: its exit
%% reason then reaches here), or crashed: the tables are closed either
%% way. After a crash, Mnesia would run on with its tables closed under
%% it: the watcher (see init/1) makes the node leave Mnesia.
terminate(_Reason, _S) ->
    %% Every handle is withdrawn before any table closes: callers then open
    %% afresh (through the next admin) instead of using a closing table.
    Open = [{A, T, published(A, T)} || {A, T} <- tables()],
    _ = [persistent_term:erase(?KEY(A, T)) || {A, T, _} <- Open],
    _ = [close_handle(H, close) || {_, _, H} <- Open],
    ok.

do_close(Alias, Tab, How) ->
    case published(Alias, Tab) of
        undefined ->
            ok;
        T ->
            persistent_term:erase(?KEY(Alias, Tab)),
            close_handle(T, How)
    end.

close_handle(T, How) ->
    _ = try
            case {How, heft:info(T, persist)} of
                {close, Dir} when Dir =/= undefined -> heft:close(T);
                _ -> heft:delete(T)
            end
        catch
            error:_ -> ok
        end,
    ok.

reason(#{'__exception__' := true, '__struct__' := 'Elixir.Heft.Error', reason := R}) -> R;
reason(#{'__exception__' := true} = E) -> 'Elixir.Exception':message(E);
reason(E) -> E.
