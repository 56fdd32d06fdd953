defmodule Heft.Contract.Case do
  @moduledoc """
  `use Heft.Contract.Case` in a contract test module, then write each test
  once with `contract/3`:

      contract "lookup/2 of a missing key is []" do
        tab = new(m)
        assert m.lookup(tab, :nope) == []
      end

  Inside the body `m` is the backend module (`:ets` or `Heft`). Each contract
  becomes one ExUnit test per backend, named "... [:ets]" and "... [Heft]",
  tagged `backend: m` (so `mix test --only backend:ets` works). The Heft test
  is skipped, with the reason, while Heft cannot run it (see
  `Heft.Contract.skip_reason/2`). Requirements go in the second argument:

      contract "bag keeps duplicates", type: :bag do ... end
      contract "select/2", functions: [select: 2] do ... end
      contract "Heft-only behaviour", only: Heft do ... end

  Tests are written inside a `for` comprehension the usual way; the name may
  be an interpolated string and the body may `unquote` loop variables.
  """
  use ExUnit.CaseTemplate

  using do
    quote do
      import Heft.Contract
      import Heft.Contract.Case, only: [contract: 2, contract: 3]
    end
  end

  defmacro contract(name, requirements \\ [], do: body) do
    only =
      case requirements do
        list when is_list(list) -> list |> Keyword.get(:only) |> Macro.expand(__CALLER__)
        _ -> nil
      end

    for m <- Heft.Contract.backends(), only == nil or m == only do
      quote do
        @tag backend: unquote(m)
        requirements = unquote(requirements)

        if type = requirements[:type], do: @tag(table_type: type)

        if reason = Heft.Contract.skip_reason(unquote(m), requirements) do
          @tag skip: reason
        end

        # `m` comes from the test's context, not a literal: compared with
        # a backend inside the body, a literal would be a comparison the
        # type checker of Elixir 1.18+ warns can never be true.
        test unquote(name) <> " [" <> unquote(Heft.Contract.label(m)) <> "]",
             %{backend: backend} do
          var!(m) = backend
          _ = var!(m)
          unquote(body)
        end
      end
    end
  end
end
