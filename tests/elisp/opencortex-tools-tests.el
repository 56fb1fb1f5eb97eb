;;; opencortex-tools-tests.el --- ERT tests of the Emacs methods behind the tools  -*- lexical-binding: t; coding: utf-8 -*-

;;; Commentary:

;; Loaded by opencortex-tests.el (so tests/test_elisp.py runs these too).
;; Each test calls one method of opencortex-tools.el as the kernel would
;; (the EPC layer only passes the arguments and the answer) against real
;; buffers and real org files in a temporary directory.  The same methods
;; over real EPC, through the kernel's tools: tests/test_emacs_tools.py.

;;; Code:

(require 'ert)
(require 'cl-lib)
(require 'subr-x)
(require 'opencortex)

(defmacro opencortex-test--with-buffers (specs &rest body)
  "Run BODY with buffers made from SPECS, a list of (NAME TEXT); kill them after."
  (declare (indent 1) (debug t))
  `(let ((names (mapcar #'car ,specs)))
     (unwind-protect
         (progn
           (dolist (spec ,specs)
             (with-current-buffer (get-buffer-create (car spec))
               (erase-buffer)
               (insert (cadr spec))))
           ,@body)
       (dolist (name names)
         (when (get-buffer name)
           (with-current-buffer name (set-buffer-modified-p nil))
           (kill-buffer name))))))

(defmacro opencortex-test--in-temp-dir (&rest body)
  "Run BODY with `default-directory' a fresh directory, removed afterwards."
  (declare (indent 0) (debug t))
  `(let ((default-directory (file-name-as-directory (make-temp-file "oc-tools" t))))
     (unwind-protect (progn ,@body)
       (delete-directory default-directory t))))

(defun opencortex-test--text (buffer)
  "The text of BUFFER without properties."
  (with-current-buffer buffer (buffer-substring-no-properties (point-min) (point-max))))

(defun opencortex-test--file-text (file)
  "The text of FILE."
  (with-temp-buffer (insert-file-contents file) (buffer-string)))

(ert-deftest opencortex-tool-methods-are-defined ()
  "Every method the tools call names a defined handler, and the connection offers them."
  (should (= 8 (length opencortex--tool-methods)))
  (dolist (method opencortex--tool-methods)
    (should (string-prefix-p "opencortex-tool-" (symbol-name (nth 0 method))))
    (should (fboundp (nth 1 method)))))

(ert-deftest opencortex-tool-list-buffers ()
  "Buffers are described with name, mode, file, modified flag and size; capped."
  (opencortex-test--with-buffers '(("oc-list-a" "hello") (" oc-internal" "x"))
    (let* ((answer (opencortex--tool-list-buffers 500))
           (entry (cl-find "oc-list-a" (plist-get answer :buffers)
                           :key (lambda (b) (plist-get b :name)) :test #'equal)))
      (should (equal entry '(:name "oc-list-a" :mode "fundamental-mode" :file nil
                                   :modified t :size 5)))
      (should-not (cl-find " oc-internal" (plist-get answer :buffers)
                           :key (lambda (b) (plist-get b :name)) :test #'equal))
      (should (= (plist-get answer :total) (length (plist-get answer :buffers)))))
    (let ((answer (opencortex--tool-list-buffers 1)))
      (should (= 1 (length (plist-get answer :buffers))))
      (should (> (plist-get answer :total) 1)))))

(ert-deftest opencortex-tool-read-buffer ()
  "The text without properties, capped; the active region; clear errors."
  (opencortex-test--with-buffers '(("oc-read" "first\nsecond\nthird\n"))
    (with-current-buffer "oc-read"
      (put-text-property 1 6 'face 'bold)
      (narrow-to-region 7 13))
    (should (equal (opencortex--tool-read-buffer "oc-read" nil 100)
                   '(:text "first\nsecond\nthird\n" :chars 19 :truncated nil :line 1)))
    (should (equal (plist-get (opencortex--tool-read-buffer "oc-read" nil 5) :text) "first"))
    (should (eq t (plist-get (opencortex--tool-read-buffer "oc-read" nil 5) :truncated)))
    (should (equal (plist-get (opencortex--tool-read-buffer "oc-read" t 100) :error)
                   "Buffer oc-read has no active region"))
    (with-current-buffer "oc-read"
      (goto-char 13)
      (set-mark 7))
    (should (equal (opencortex--tool-read-buffer "oc-read" t 100)
                   '(:text "second" :chars 6 :truncated nil :line 2)))
    (should (string-prefix-p "No buffer is called oc-none"
                             (plist-get (opencortex--tool-read-buffer "oc-none" nil 10) :error)))
    (should (plist-get (opencortex--tool-read-buffer 42 nil 10) :error))))

(ert-deftest opencortex-tool-around ()
  "The lines around where a change goes, numbered; the text to replace found once."
  (opencortex-test--with-buffers
      '(("oc-around" "l1\nl2\nl3\nl4\nl5\nl6\nl7\nl8\n") ("oc-twice" "aaa b"))
    (should (equal (opencortex--tool-around "oc-around" "end" nil)
                   '(:before "l6\nl7\nl8\n" :after "" :line 6)))
    (should (equal (opencortex--tool-around "oc-around" "start" nil)
                   '(:before "" :after "l1\nl2\nl3\nl4\n" :line 1)))
    (should (equal (opencortex--tool-around "oc-around" nil "l5")
                   '(:before "l2\nl3\nl4\n" :after "\nl6\nl7\nl8\n" :line 2)))
    (should (string-match-p "does not occur in oc-around"
                            (plist-get (opencortex--tool-around "oc-around" nil "L5") :error)))
    (should (string-match-p "occurs more than once"
                            (plist-get (opencortex--tool-around "oc-twice" nil "aa") :error)))
    (should (string-match-p "must be \"end\", \"point\" or \"start\""
                            (plist-get (opencortex--tool-around "oc-around" "middle" nil) :error)))))

(ert-deftest opencortex-tool-insert ()
  "Insert at the end, start or point; control characters made visible; point kept."
  (opencortex-test--with-buffers '(("oc-insert" "ab\ncd\n"))
    (with-current-buffer "oc-insert" (goto-char 4))
    (should (equal (opencortex--tool-insert "oc-insert" "end\n" "end")
                   '(:buffer "oc-insert" :line 3 :chars 4)))
    (should (equal (opencortex--tool-insert "oc-insert" "start " "start")
                   '(:buffer "oc-insert" :line 1 :chars 6)))
    (should (equal (opencortex-test--text "oc-insert") "start ab\ncd\nend\n"))
    (with-current-buffer "oc-insert" (goto-char 10))
    (should (equal (plist-get (opencortex--tool-insert "oc-insert" "\e[2J\r\u202e!" "point")
                              :chars)
                   14))
    (should (equal (opencortex-test--text "oc-insert")
                   "start ab\n␛[2J␍⟨U+202E⟩!cd\nend\n"))
    (with-current-buffer "oc-insert"
      (should (= (point) 10))
      (should (consp buffer-undo-list)))))

(ert-deftest opencortex-tool-insert-refuses ()
  "No insert into a missing, read-only or chat buffer; nothing is created."
  (opencortex-test--with-chat
    (opencortex-test--with-buffers '(("oc-ro" "x"))
      (with-current-buffer "oc-ro" (setq buffer-read-only t))
      (should (equal (plist-get (opencortex--tool-insert "oc-ro" "y" "end") :error)
                     "Buffer oc-ro is read-only"))
      (should (string-prefix-p "No buffer is called oc-missing"
                               (plist-get (opencortex--tool-insert "oc-missing" "y" "end") :error)))
      (should-not (get-buffer "oc-missing"))
      (should (equal (plist-get (opencortex--tool-insert opencortex-chat-buffer-name "y" "end")
                                :error)
                     "The chat buffer is written by replies, not by tools"))
      (should (equal (opencortex-test--text "oc-ro") "x")))))

(ert-deftest opencortex-tool-insert-refuses-a-file-changed-on-disk ()
  "A buffer whose file changed on disk is not written: that would need a question."
  (opencortex-test--in-temp-dir
    (let ((file (expand-file-name "changed.txt")))
      (with-temp-file file (insert "a\n"))
      (let ((buffer (find-file-noselect file)))
        (unwind-protect
            (progn
              (set-file-times file (time-add nil 100))
              (should (string-match-p "changed on disk since Emacs read it"
                                      (plist-get (opencortex--tool-insert "changed.txt" "b" "end")
                                                 :error)))
              (should (equal (opencortex-test--text buffer) "a\n")))
          (kill-buffer buffer))))))

(ert-deftest opencortex-tool-replace ()
  "The old text must occur exactly once, case and all; the new text is made visible."
  (opencortex-test--with-buffers '(("oc-replace" "one two\nthree two\nTwo\n"))
    (should (string-match-p "more than once"
                            (plist-get (opencortex--tool-replace "oc-replace" "two" "2") :error)))
    (should (string-match-p "does not occur"
                            (plist-get (opencortex--tool-replace "oc-replace" "four" "4") :error)))
    (should (string-match-p "is empty"
                            (plist-get (opencortex--tool-replace "oc-replace" "" "4") :error)))
    (should (equal (opencortex--tool-replace "oc-replace" "Two" "2\e")
                   '(:buffer "oc-replace" :line 3 :chars 2)))
    (should (equal (opencortex--tool-replace "oc-replace" "three two" "3")
                   '(:buffer "oc-replace" :line 2 :chars 1)))
    (should (equal (opencortex-test--text "oc-replace") "one two\n3\n2␛\n"))))

(ert-deftest opencortex-tool-capture ()
  "A note becomes an org entry at the end of the file, saved; no buffer is left open."
  (opencortex-test--in-temp-dir
    (let* ((file (expand-file-name "inbox.org"))
           (answer (opencortex--tool-capture
                    file "Buy milk\e" "two litres\n* not a heading\n#+begin_src sh\n:END:")))
      (should (equal (plist-get answer :file) file))
      (should (= (plist-get answer :line) 1))
      (should (eq (plist-get answer :saved) t))
      (should-not (find-buffer-visiting file))
      (should (string-match-p
               (concat "\\`\\* Buy milk␛\n:PROPERTIES:\n:CREATED: +\\[[0-9]\\{4\\}-[0-9-]\\{5\\} "
                       "[^]]+ [0-9:]\\{5\\}\\]\n:END:\ntwo litres\n,\\* not a heading\n"
                       ",#\\+begin_src sh\n,:END:\n\\'")
               (opencortex-test--file-text file)))
      (should (= (plist-get (opencortex--tool-capture file "Second" "more") :line) 9)))))

(ert-deftest opencortex-tool-capture-keeps-unsaved-changes-unsaved ()
  "A capture file open with unsaved changes gets the entry but is not saved."
  (opencortex-test--in-temp-dir
    (let ((file (expand-file-name "inbox.org")))
      (with-temp-file file (insert "* Old\n"))
      (let ((buffer (find-file-noselect file)))
        (unwind-protect
            (progn
              (with-current-buffer buffer (goto-char (point-max)) (insert "mine\n"))
              (should (eq nil (plist-get (opencortex--tool-capture file "New" "x") :saved)))
              (should (equal (opencortex-test--file-text file) "* Old\n"))
              (should (string-match-p "\\`\\* Old\nmine\n\\* New\n" (opencortex-test--text buffer)))
              (should (buffer-live-p buffer)))
          (with-current-buffer buffer (set-buffer-modified-p nil))
          (kill-buffer buffer))))))

(ert-deftest opencortex-tool-capture-refuses ()
  "A missing directory or a file that is not org is an error."
  (opencortex-test--in-temp-dir
    (should (string-match-p "does not exist"
                            (plist-get (opencortex--tool-capture
                                        (expand-file-name "no/such/inbox.org") "h" "t")
                                       :error)))
    (should (string-match-p "is not an org file"
                            (plist-get (opencortex--tool-capture
                                        (expand-file-name "notes.txt") "h" "t")
                                       :error)))
    (should-not (file-exists-p "notes.txt"))
    (let ((file (expand-file-name "latin.org")))
      (with-temp-file file (insert "# -*- coding: latin-1 -*-\n* Old\n"))
      (should (string-match-p "saved as iso-latin-1-unix, which cannot hold"
                              (plist-get (opencortex--tool-capture file "Globe \U0001F30D" "t")
                                         :error)))
      (should (equal (opencortex-test--file-text file) "# -*- coding: latin-1 -*-\n* Old\n"))
      (should-not (find-buffer-visiting file)))))

(defun opencortex-test--day (days &optional format)
  "The date DAYS days from today, as FORMAT (default \"%Y-%m-%d\")."
  (format-time-string (or format "%Y-%m-%d") (time-add nil (days-to-time days))))

(ert-deftest opencortex-tool-agenda ()
  "Entries of the agenda files in the range, with date, time, TODO, heading, kind, file.
Dates are counted from today: org lists a TODO scheduled before today as
past-scheduled, so fixed dates would change the answer as time passes."
  (opencortex-test--in-temp-dir
    (let ((file (expand-file-name "agenda.org")))
      (with-temp-file file
        (insert (format "* TODO Call Bob\nSCHEDULED: <%s 10:00>\n"
                        (opencortex-test--day 1 "%Y-%m-%d %a"))
                (format "* Meeting\n<%s 14:30>\n" (opencortex-test--day 2 "%Y-%m-%d %a"))
                (format "* Later\n<%s>\n" (opencortex-test--day 40 "%Y-%m-%d %a"))))
      (let* ((org-agenda-files (list file (expand-file-name "missing.org")))
             (from (opencortex-test--day 0))
             (to (opencortex-test--day 7))
             (answer (opencortex--tool-agenda from to 10)))
        (should (equal (plist-get answer :entries)
                       `((:date ,(opencortex-test--day 1) :time "10:00" :todo "TODO"
                                :heading "Call Bob" :kind "scheduled"
                                :file ,(abbreviate-file-name file))
                         (:date ,(opencortex-test--day 2) :time "14:30" :todo nil
                                :heading "Meeting" :kind "timestamp"
                                :file ,(abbreviate-file-name file)))))
        (should (= 1 (plist-get answer :files)))
        (should-not (plist-get answer :truncated))
        (should-not (find-buffer-visiting file))
        (should (plist-get (opencortex--tool-agenda from to 1) :truncated))
        (should (string-match-p "ends (2026-11-01) before it starts"
                                (plist-get (opencortex--tool-agenda "2026-11-23" "2026-11-01" 5)
                                           :error)))
        (should (string-match-p "no date 2026-02-30"
                                (plist-get (opencortex--tool-agenda "2026-02-30" "2026-03-01" 5)
                                           :error)))
        (should (string-match-p "longer than 366"
                                (plist-get (opencortex--tool-agenda "2026-01-01" "2027-06-01" 5)
                                           :error)))))))

(ert-deftest opencortex-tool-open ()
  "A file is shown at its heading in another window; the selected window stays."
  (opencortex-test--in-temp-dir
    (let ((file (expand-file-name "open.org"))
          (selected (selected-window)))
      (with-temp-file file (insert "* First\ntext\n* Second heading\nmore\n"))
      (unwind-protect
          (let ((answer (opencortex--tool-open file "Second heading")))
            (should (equal answer '(:buffer "open.org" :shown t :line 3)))
            (should (eq (selected-window) selected))
            (let ((window (get-buffer-window "open.org")))
              (should window)
              (should-not (eq window selected))
              (should (= (window-point window)
                         (with-current-buffer "open.org" (save-excursion
                                                           (goto-char (point-min))
                                                           (forward-line 2) (point))))))
            (should (equal (plist-get (opencortex--tool-open file "Third") :error)
                           "open.org has no heading Third"))
            (should (string-prefix-p "No file"
                                     (plist-get (opencortex--tool-open
                                                 (expand-file-name "none.org") nil)
                                                :error))))
        (delete-other-windows selected)
        (when (get-buffer "open.org") (kill-buffer "open.org"))))))

(provide 'opencortex-tools-tests)
;;; opencortex-tools-tests.el ends here
