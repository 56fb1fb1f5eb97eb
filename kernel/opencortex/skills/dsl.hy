"The `defskill` and `deftool` macros, the forms a skill note needs.

The skill loader makes both available in every skill module; elsewhere
write `(require opencortex.skills.dsl [defskill deftool])`."

(defmacro defskill [_hy_compiler name #* options]
  "Bind NAME to a skill built from the keyword OPTIONS.

  `(defskill greeter :trigger greeting? :priority 20 :description \"...\"
     :probabilistic (fn [ctx] ...) :deterministic (fn [action ctx] ...))`

  `:trigger` is required.  The skill records its name, the module it is
  defined in, and the file and line where this form stands; the options
  themselves are checked by `opencortex.skills.skill.define-skill`."
  (when (not (isinstance name hy.models.Symbol))
    (raise (TypeError (+ "defskill needs a name first, e.g. (defskill greeter :trigger greeting?); got "
                         (hy.repr name)))))
  (setv form _hy_compiler.this)
  `(setv ~name (hy.I.opencortex/skills/skill.define-skill
                 ~(str name) __name__ ~_hy_compiler.filename ~form.start-line
                 ~@options)))

(defmacro deftool [_hy_compiler name params #* rest]
  "Bind NAME to a tool: an async function of the tool context and typed arguments.

  `(deftool files-read [ctx #^ str path #^ int [max-chars 20000]]
     \"Read a text file under the configured roots.\"
     :risk :read-only
     ...body...)`

  Every argument after CTX needs a type (`#^ TYPE`); defaults come as
  `[name value]`.  The docstring is what the model reads.  Options after it:
  `:risk` (`:read-only`, `:writes` or `:external`; default `:read-only`) and
  `:preview` (a function of ctx and the arguments saying what would change,
  shown to the person asked to approve) and `:needs-approval` (a function of
  ctx and the arguments returning a reason when this call must be approved
  although its risk class would not ask, else None).  The body may `await`."
  (when (not (isinstance name hy.models.Symbol))
    (raise (TypeError (+ "deftool needs a name first, e.g. (deftool clock [ctx] \"...\" ...); got "
                         (hy.repr name)))))
  (when (not (isinstance params hy.models.List))
    (raise (TypeError (+ "deftool " (str name) " needs its parameters next, e.g. [ctx #^ str path]"))))
  (setv form _hy_compiler.this
        doc (if (and rest (isinstance (get rest 0) hy.models.String)) (get rest 0) None)
        rest (if doc (cut rest 1 None) rest)
        options [])
  (while (and (>= (len rest) 2) (isinstance (get rest 0) hy.models.Keyword))
    (.extend options (cut rest 0 2))
    (setv rest (cut rest 2 None)))
  (setv function (hy.models.Symbol (+ "_tool_" (str name))))
  `(do
     (defn :async ~function ~params ~@(if doc [doc] []) ~@rest)
     (setv ~name (hy.I.opencortex/tools/define.define-tool
                   ~(str name) ~function __name__ ~_hy_compiler.filename ~form.start-line
                   ~@options))))

;; What the skill loader hands to `hy.eval` as `:macros`.
(setv SKILL-MACROS {"defskill" (get-macro defskill) "deftool" (get-macro deftool)})
