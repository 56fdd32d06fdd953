defmodule Heft.Test.Wait do
  # Polls a condition the tests cannot be told of (a background thread's
  # work, a dump starting): every millisecond, for up to `ms` milliseconds.
  @moduledoc false

  @doc "True as soon as `fun.()` is, false if it is not within `ms` ms."
  def until(fun, ms \\ 5000) do
    deadline = System.monotonic_time(:millisecond) + ms
    poll(fun, deadline)
  end

  defp poll(fun, deadline) do
    cond do
      fun.() -> true
      System.monotonic_time(:millisecond) >= deadline -> false
      true -> Process.sleep(1) && poll(fun, deadline)
    end
  end
end
