%% A common_test hook for test/otp_ets/run.sh: appends each test case's
%% outcome to a file as soon as it is known, one term a line,
%%
%%   {Case, passed | failed | skipped, Detail}.
%%
%% where Detail is the failure or skip reason printed on one line (`""'
%% for a pass). A case may have several lines (its end, then a failure
%% common_test reports after it): the last one is its outcome. With
%% `{fresh, false}' the file's earlier lines are kept.
-module(heft_ets_cth).

-export([init/2, post_end_per_testcase/5, on_tc_fail/4, on_tc_skip/4]).

init(_Id, Opts) ->
    File = proplists:get_value(file, Opts),
    proplists:get_value(fresh, Opts, true) andalso (ok =:= file:write_file(File, <<>>)),
    {ok, File}.

post_end_per_testcase(_Suite, Case, Config, Return, File) ->
    case proplists:get_value(tc_status, Config, ok) of
        ok -> write(File, Case, passed, "");
        {failed, Reason} -> write(File, Case, failed, Reason);
        {skipped, Reason} -> write(File, Case, skipped, Reason);
        Other -> write(File, Case, failed, Other)
    end,
    {Return, File}.

on_tc_fail(_Suite, Case, Reason, File) ->
    write(File, Case, failed, Reason),
    File.

on_tc_skip(_Suite, Case, Reason, File) ->
    write(File, Case, skipped, Reason),
    File.

%% Configuration functions ({init_per_group, G}, init_per_suite...) are
%% left out: their failures show up as the skips of the cases they hold.
write(_File, {Config, _Group}, _Status, _Detail)
  when Config =:= init_per_group; Config =:= end_per_group ->
    ok;
write(File, {Case, _Group}, Status, Detail) ->
    write(File, Case, Status, Detail);
write(_File, Config, _Status, _Detail)
  when Config =:= init_per_suite; Config =:= end_per_suite ->
    ok;
write(File, Case, Status, Detail) ->
    Line = lists:flatten(io_lib:format("~0tP", [Detail, 12])),
    ok = file:write_file(File, io_lib:format("~0tp.~n", [{Case, Status, Line}]), [append]).
